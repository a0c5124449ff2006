// A deliberately small JSON reader: the cache is a flat list of flat objects, so a tokenizer for
// strings, numbers and punctuation is enough and keeps the plugin free of a JSON dependency.
#include "conv_int8/host/tuning_cache.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace trtfuse {
namespace rconv {
namespace {

struct Lexer {
    std::string const& s;
    size_t i = 0;
    void ws() { while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i; }
    bool eat(char c) { ws(); if (i < s.size() && s[i] == c) { ++i; return true; } return false; }
    bool string(std::string* out) {
        ws();
        if (i >= s.size() || s[i] != '"') return false;
        ++i;
        out->clear();
        while (i < s.size() && s[i] != '"') {
            if (s[i] == '\\' && i + 1 < s.size()) ++i;   // the cache holds no escapes worth decoding
            out->push_back(s[i++]);
        }
        return i < s.size() && s[i++] == '"';
    }
    bool number(double* out) {
        ws();
        char const* begin = s.c_str() + i;
        char* end = nullptr;
        *out = std::strtod(begin, &end);
        if (end == begin) return false;
        i += static_cast<size_t>(end - begin);
        return true;
    }
    // Skip any JSON value (used for keys we ignore).
    bool skip() {
        ws();
        if (i >= s.size()) return false;
        std::string str;
        double d;
        if (s[i] == '"') return string(&str);
        if (s[i] == '{' || s[i] == '[') {
            char open = s[i], close = open == '{' ? '}' : ']';
            int depth = 0;
            bool in_str = false;
            for (; i < s.size(); ++i) {
                char c = s[i];
                if (in_str) { if (c == '\\') ++i; else if (c == '"') in_str = false; continue; }
                if (c == '"') in_str = true;
                else if (c == open) ++depth;
                else if (c == close && --depth == 0) { ++i; return true; }
            }
            return false;
        }
        if (s.compare(i, 4, "true") == 0 || s.compare(i, 4, "null") == 0) { i += 4; return true; }
        if (s.compare(i, 5, "false") == 0) { i += 5; return true; }
        return number(&d);
    }
};

bool parse_entry(Lexer& lx, CacheEntry* e) {
    if (!lx.eat('{')) return false;
    if (lx.eat('}')) return true;
    do {
        std::string key;
        if (!lx.string(&key) || !lx.eat(':')) return false;
        double d = 0;
        if (key == "gpu") { if (!lx.string(&e->gpu)) return false; }
        else if (key == "config") { if (!lx.string(&e->config)) return false; }
        else if (key == "family") { if (!lx.string(&e->family)) return false; }
        else if (key == "cin" || key == "cout" || key == "hw" || key == "batch" || key == "residual" ||
                 key == "stride" || key == "proj_cin") {
            if (!lx.number(&d) || d != std::floor(d) || d < 0 || d > 2e9) return false;
            int v = static_cast<int>(d);
            (key == "cin" ? e->cin : key == "cout" ? e->cout : key == "hw" ? e->hw : key == "batch" ? e->batch
             : key == "residual" ? e->residual : key == "stride" ? e->stride : e->proj_cin) = v;
        } else if (!lx.skip()) return false;
    } while (lx.eat(','));
    return lx.eat('}');
}

}  // namespace

bool parse_tuning_cache(std::string const& text, std::vector<CacheEntry>* entries, std::string* error) {
    Lexer lx{text};
    entries->clear();
    if (!lx.eat('{')) { *error = "not a JSON object"; return false; }
    bool seen = false;
    if (!lx.eat('}')) {
        do {
            std::string key;
            if (!lx.string(&key) || !lx.eat(':')) { *error = "malformed key"; return false; }
            if (key == "entries") {
                seen = true;
                if (!lx.eat('[')) { *error = "\"entries\" is not a list"; return false; }
                if (!lx.eat(']')) {
                    do {
                        CacheEntry e;
                        if (!parse_entry(lx, &e)) { *error = "malformed entry"; return false; }
                        if (!e.gpu.empty() && !e.config.empty() && e.cin > 0 && e.cout > 0 && e.hw > 0)
                            entries->push_back(e);
                    } while (lx.eat(','));
                    if (!lx.eat(']')) { *error = "unterminated \"entries\""; return false; }
                }
            } else if (!lx.skip()) { *error = "malformed value"; return false; }
        } while (lx.eat(','));
        if (!lx.eat('}')) { *error = "unterminated object"; return false; }
    }
    if (!seen) { *error = "no \"entries\" list"; return false; }
    return true;
}

bool read_tuning_cache(std::string const& path, std::vector<CacheEntry>* entries, std::string* error) {
    std::ifstream f(path);
    if (!f) { *error = "cannot open " + path; return false; }
    std::stringstream ss;
    ss << f.rdbuf();
    return parse_tuning_cache(ss.str(), entries, error);
}

CacheEntry const* lookup(std::vector<CacheEntry> const& entries, std::string const& gpu, int cin, int cout, int hw,
                         int batch, bool residual, int stride, int proj_cin, std::string const& family) {
    CacheEntry const* best = nullptr;
    double best_d = 0;
    for (auto const& e : entries) {
        if (e.family != family || e.gpu != gpu || e.cin != cin || e.cout != cout || e.hw != hw) continue;
        if ((e.residual != 0) != residual || e.stride != stride || e.proj_cin != proj_cin) continue;
        double d = std::fabs(std::log(std::max(e.batch, 1)) - std::log(std::max(batch, 1)));
        if (d > std::log(static_cast<double>(kMaxBatchRatio)) + 1e-9) continue;  // 1e-9: a ratio of exactly 16 is in
        if (!best || d < best_d) { best = &e; best_d = d; }
    }
    return best;
}

}  // namespace rconv
}  // namespace trtfuse
