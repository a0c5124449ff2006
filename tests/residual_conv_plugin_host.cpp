// Host-only checks of plugins/residual_conv/residual_conv_plugin.cpp: no GPU, no libnvinfer (only TensorRT's headers
// and the kernels library's validation functions). The creator's fields and refusals, the serialization (RCV5
// written: the 1x1 form with and without the projection, with and without the chained next conv, the 3x3 form, and
// the stem with and without the chained next conv; RCV4, RCV3, RCV2 and RCV1 blobs of older engines refused),
// configurePlugin's refusals.
// Built and run by tests/test_residual_conv_plugin.py; prints "ok NAME" / "FAIL NAME" and exits with the failures.
#include <NvInferRuntime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "plugin_host_creator.h"   // host_creator() instead of the registry
#include "residual_conv/residual_conv_plugin.cpp"

using namespace nvinfer1;

namespace {

int failures = 0;

void expect(bool ok, std::string const& what) {
    std::printf("%s %s\n", ok ? "ok" : "FAIL", what.c_str());
    failures += !ok;
}

// A field collection whose values live as long as it does.
class Fields {
public:
    template <typename T> void add(std::string const& name, std::vector<T> const& v, PluginFieldType type) {
        bytes_.emplace_back(reinterpret_cast<char const*>(v.data()), reinterpret_cast<char const*>(v.data() + v.size()));
        names_.emplace_back(name);
        types_.push_back(type);
        lengths_.push_back(static_cast<int32_t>(v.size()));
    }
    void drop(std::string const& name) { dropped_.push_back(name); }
    void set_int(std::string const& name, int32_t v) { set(name, &v, sizeof v); }
    void set_float(std::string const& name, float v) { set(name, &v, sizeof v); }
    IPluginV2DynamicExt* create() {
        fields_.clear();
        for (size_t i = 0; i < names_.size(); ++i) {
            bool skip = false;
            for (auto const& d : dropped_) skip = skip || d == names_[i];
            if (!skip) fields_.emplace_back(names_[i].c_str(), bytes_[i].data(), types_[i], lengths_[i]);
        }
        PluginFieldCollection fc;
        fc.nbFields = static_cast<int32_t>(fields_.size());
        fc.fields = fields_.data();
        return static_cast<IPluginV2DynamicExt*>(host_creator()->createPlugin("host", &fc));
    }

private:
    void set(std::string const& name, void const* v, size_t n) {
        for (size_t i = 0; i < names_.size(); ++i)
            if (names_[i] == name) bytes_[i].assign(static_cast<char const*>(v), static_cast<char const*>(v) + n);
    }
    std::vector<std::string> names_, dropped_;
    std::vector<std::string> bytes_;
    std::vector<PluginFieldType> types_;
    std::vector<int32_t> lengths_;
    std::vector<PluginField> fields_;
};

// weights [cout][cin] (taps 9: [cout][cin][3][3], 49: [cout][cin][7][7]; INT32, as the ONNX rewrite emits them),
// w_scale, bias; prefix "" or "proj_"
void add_layer(Fields* f, std::string const& prefix, int cin, int cout, int seed, float x_scale, float out_scale,
               int taps = 1) {
    std::vector<int32_t> w(static_cast<size_t>(taps) * cin * cout);
    std::vector<float> ws(cout), b(cout);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int32_t>((i * 37 + seed) % 255) - 127;
    for (int n = 0; n < cout; ++n) {
        ws[n] = 0.001f * (1 + (n + seed) % 7);
        b[n] = 0.25f * ((n + seed) % 5) - 0.5f;
    }
    f->add(prefix + "weights", w, PluginFieldType::kINT32);
    f->add(prefix + "w_scale", ws, PluginFieldType::kFLOAT32);
    f->add(prefix + "bias", b, PluginFieldType::kFLOAT32);
    f->add(prefix + "x_scale", std::vector<float>{x_scale}, PluginFieldType::kFLOAT32);
    f->add(prefix + "out_scale", std::vector<float>{out_scale}, PluginFieldType::kFLOAT32);
    f->add(prefix + "cin", std::vector<int32_t>{cin}, PluginFieldType::kINT32);
}

Fields tail_fields(int cin, int cout) {
    Fields f;
    add_layer(&f, "", cin, cout, 1, 0.02f, 0.03f);
    f.add("r_scale", std::vector<float>{0.04f}, PluginFieldType::kFLOAT32);
    f.add("cout", std::vector<int32_t>{cout}, PluginFieldType::kINT32);
    f.add("relu", std::vector<int32_t>{1}, PluginFieldType::kINT32);
    return f;
}

// a 3x3 conv + BN + ReLU: no residual input, kernel_size 3
Fields conv3x3_fields(int cin, int cout) {
    Fields f;
    add_layer(&f, "", cin, cout, 3, 0.02f, 0.03f, 9);
    f.add("r_scale", std::vector<float>{0.f}, PluginFieldType::kFLOAT32);
    f.add("cout", std::vector<int32_t>{cout}, PluginFieldType::kINT32);
    f.add("relu", std::vector<int32_t>{1}, PluginFieldType::kINT32);
    f.add("kernel_size", std::vector<int32_t>{3}, PluginFieldType::kINT32);
    return f;
}

// the stem: 7x7/2 conv + BN + ReLU + 3x3/2 max pool, kernel_size 7, stride 2, no residual input
Fields stem_fields(int cin, int cout) {
    Fields f;
    add_layer(&f, "", cin, cout, 4, 0.02f, 0.03f, 49);
    f.add("r_scale", std::vector<float>{0.f}, PluginFieldType::kFLOAT32);
    f.add("cout", std::vector<int32_t>{cout}, PluginFieldType::kINT32);
    f.add("relu", std::vector<int32_t>{1}, PluginFieldType::kINT32);
    f.add("stride", std::vector<int32_t>{2}, PluginFieldType::kINT32);
    f.add("kernel_size", std::vector<int32_t>{7}, PluginFieldType::kINT32);
    return f;
}

// the blob an engine of an older version would hold: `drop` trailing bytes cut, its tag
std::vector<char> older(std::vector<char> const& b, size_t drop, uint32_t tag) {
    std::vector<char> o(b.begin(), b.end() - static_cast<long>(drop));
    std::memcpy(o.data(), &tag, sizeof tag);
    return o;
}

Fields fused_fields(int pcin, int cin, int cout, int stride) {
    Fields f = tail_fields(cin, cout);
    add_layer(&f, "proj_", pcin, cout, 2, 0.05f, 0.04f);
    f.add("proj_stride", std::vector<int32_t>{stride}, PluginFieldType::kINT32);
    return f;
}

// the next conv1 chained onto a layer of `cout` output channels (its x_scale: the layer's out_scale, 0.03)
void add_next(Fields* f, int cout, int next_cout) {
    add_layer(f, "next_", cout, next_cout, 3, 0.03f, 0.05f);
    f->drop("next_cin");   // not a field: the next conv's cin is the layer's cout
    f->add("next_cout", std::vector<int32_t>{next_cout}, PluginFieldType::kINT32);
    f->add("next_relu", std::vector<int32_t>{1}, PluginFieldType::kINT32);
}

std::vector<char> blob(IPluginV2DynamicExt const* p) {
    std::vector<char> b(p->getSerializationSize());
    p->serialize(b.data());
    return b;
}

uint32_t tag(std::vector<char> const& b) {
    uint32_t t = 0;
    std::memcpy(&t, b.data(), sizeof t);
    return t;
}

IPluginV2DynamicExt* deserialize(std::vector<char> const& b) {
    return static_cast<IPluginV2DynamicExt*>(host_creator()->deserializePlugin("host", b.data(), b.size()));
}

DynamicPluginTensorDesc desc(int64_t n, int64_t c, int64_t h, int64_t w) {
    DynamicPluginTensorDesc d{};
    d.desc.dims.nbDims = 4;
    int64_t const v[4] = {n, c, h, w};
    for (int i = 0; i < 4; ++i) d.desc.dims.d[i] = v[i];
    d.desc.type = DataType::kINT8;
    d.desc.format = TensorFormat::kCHW32;
    d.min = d.desc.dims;
    d.max = d.desc.dims;   // N unknown (-1) below: no device layer is made for the workspace (no GPU here)
    return d;
}

void configure(IPluginV2DynamicExt* p, std::vector<DynamicPluginTensorDesc> const& in, int outputs = 1) {
    std::vector<DynamicPluginTensorDesc> out(outputs, desc(-1, -1, -1, -1));
    std::fprintf(stderr, "--- configure\n");
    p->configurePlugin(in.data(), static_cast<int32_t>(in.size()), out.data(), outputs);
}

}  // namespace

int main() {
    int const pcin = 96, cin = 64, cout = 128;

    // ---- the plain tail: RCV5 with the projection flag 0, kernel_size 1 and the next flag 0, a byte-identical round
    // trip
    Fields tail = tail_fields(cin, cout);
    IPluginV2DynamicExt* t = tail.create();
    expect(t != nullptr, "tail created");
    if (!t) return 1;
    std::vector<char> tb = blob(t);
    expect(tag(tb) == 0x52435635, "tail serializes as RCV5");
    IPluginV2DynamicExt* t2 = deserialize(tb);
    expect(t2 && blob(t2) == tb, "tail round trip");

    // ---- blobs of the older formats RCV4 (no next flag), RCV3 (no kernel_size either), RCV2 (no projection flag
    // either) and RCV1 (no stride either) are refused (the engine must be rebuilt), as is an RCV5 blob whose tag
    // alone says an older format
    size_t const ks = sizeof(int32_t), flag_at = tb.size() - 3 * ks;
    expect(!deserialize(older(tb, ks, 0x52435634)), "RCV4 blob refused");
    expect(!deserialize(older(tb, 2 * ks, 0x52435633)), "RCV3 blob refused");
    std::vector<char> v2 = older(tb, 3 * ks, 0x52435632);
    expect(!deserialize(v2), "RCV2 blob refused");
    std::vector<char> v1(v2);
    size_t const stride_at = sizeof(uint32_t) + 3 * sizeof(int32_t);
    v1.erase(v1.begin() + static_cast<long>(stride_at), v1.begin() + static_cast<long>(stride_at + sizeof(int32_t)));
    uint32_t const tag1 = 0x52435631;
    std::memcpy(v1.data(), &tag1, sizeof tag1);
    expect(!deserialize(v1), "RCV1 blob refused");
    expect(!deserialize(older(tb, 0, 0x52435634)), "an RCV5 layout tagged RCV4 refused");

    // ---- the fused form
    Fields fused = fused_fields(pcin, cin, cout, 2);
    IPluginV2DynamicExt* f = fused.create();
    expect(f != nullptr, "fused created");
    if (!f) return 1;
    std::vector<char> fb = blob(f);
    expect(tag(fb) == 0x52435635 && fb.size() > tb.size() + static_cast<size_t>(pcin) * cout, "fused serializes as RCV5");
    IPluginV2DynamicExt* f2 = deserialize(fb);
    expect(f2 && blob(f2) == fb, "fused round trip");
    expect(!deserialize(older(fb, ks, 0x52435634)) && !deserialize(older(fb, 2 * ks, 0x52435633)),
           "fused RCV4 and RCV3 blobs refused");
    std::vector<char> cut(fb.begin(), fb.end() - 1), longer(fb), flag2(fb);
    longer.push_back(0);
    int32_t const two = 2;
    std::memcpy(flag2.data() + flag_at, &two, sizeof two);
    expect(!deserialize(cut) && !deserialize(longer) && !deserialize(flag2), "bad fused blobs refused");
    std::vector<char> proj_flag_only(tb);   // the flag set without the projection's fields
    int32_t const one = 1;
    std::memcpy(proj_flag_only.data() + flag_at, &one, sizeof one);
    expect(!deserialize(proj_flag_only), "projection flag without its fields refused");
    // a tail and a fused layer differ in what they send through the blob: a fused blob read back is fused
    PluginTensorDesc io[3]{};
    for (auto& d : io) {
        d.type = DataType::kINT8;
        d.format = TensorFormat::kCHW32;
    }
    expect(f2 && f2->supportsFormatCombination(2, io, 2, 1) && !f2->supportsFormatCombination(1, io, 1, 1),
           "fused takes inputs [x, xp]");
    expect(t->getWorkspaceSize(io, 2, io + 2, 1) == 0, "tail needs no workspace");

    // ---- the creator: all or none of proj_*, proj_stride optional, the tail's own rules
    {
        Fields g = fused_fields(pcin, cin, cout, 1);
        g.drop("proj_stride");
        expect(g.create() != nullptr, "proj_stride optional");
    }
    for (char const* name : {"proj_weights", "proj_w_scale", "proj_bias", "proj_x_scale", "proj_out_scale",
                             "proj_cin"}) {
        Fields g = fused_fields(pcin, cin, cout, 2);
        g.drop(name);
        expect(g.create() == nullptr, std::string("missing ") + name + " refused");
    }
    {
        Fields g = tail_fields(cin, cout);
        g.add("proj_stride", std::vector<int32_t>{2}, PluginFieldType::kINT32);
        expect(g.create() == nullptr, "proj_stride alone refused");
    }
    {
        Fields g = fused_fields(pcin, cin, cout, 3);
        expect(g.create() == nullptr, "proj_stride 3 refused");
    }
    {
        Fields g = fused_fields(pcin, cin, cout, 2);
        g.set_float("r_scale", 0.f);
        expect(g.create() == nullptr, "fused with r_scale 0 refused");
    }
    {
        Fields g = fused_fields(pcin, cin, cout, 2);
        g.add("stride", std::vector<int32_t>{2}, PluginFieldType::kINT32);
        expect(g.create() == nullptr, "fused with a strided tail refused");
    }
    {
        Fields g = fused_fields(pcin, cin, cout, 2);
        g.set_int("proj_cin", pcin - 1);
        expect(g.create() == nullptr, "proj_weights of the wrong size refused");
    }
    {
        Fields g = fused_fields(pcin, cin, cout, 2);
        g.set_float("proj_out_scale", -1.f);
        expect(g.create() == nullptr, "bad proj_out_scale refused");
    }

    // ---- the 3x3 form: RCV5 with kernel_size 3, one input, its refusals
    Fields conv3 = conv3x3_fields(cin, cout);
    IPluginV2DynamicExt* c3 = conv3.create();
    expect(c3 != nullptr, "3x3 created");
    if (!c3) return 1;
    std::vector<char> cb = blob(c3);
    int32_t kernel_size = 0;
    std::memcpy(&kernel_size, cb.data() + cb.size() - 2 * ks, ks);
    expect(tag(cb) == 0x52435635 && kernel_size == 3, "3x3 serializes as RCV5 with kernel_size 3");
    IPluginV2DynamicExt* c32 = deserialize(cb);
    expect(c32 && blob(c32) == cb && c32->supportsFormatCombination(1, io, 1, 1), "3x3 round trip, input [x]");
    expect(!deserialize(older(cb, 2 * ks, 0x52435633)), "a 3x3 blob tagged RCV3 refused");
    {
        Fields g = conv3x3_fields(cin, cout);
        g.set_float("r_scale", 0.04f);
        expect(g.create() == nullptr, "3x3 with a residual input refused");
    }
    {
        Fields g = conv3x3_fields(cin, cout);
        g.set_int("kernel_size", 5);
        expect(g.create() == nullptr, "kernel_size 5 refused");
    }
    {
        Fields g = conv3x3_fields(cin, cout);
        g.add("stride", std::vector<int32_t>{2}, PluginFieldType::kINT32);
        IPluginV2DynamicExt* s2 = g.create();
        expect(s2 != nullptr, "3x3 at stride 2 created");
        if (s2) s2->destroy();
    }
    {
        Fields g = conv3x3_fields(cin, cout);
        g.add("stride", std::vector<int32_t>{3}, PluginFieldType::kINT32);
        expect(g.create() == nullptr, "3x3 at stride 3 refused");
    }
    {
        Fields g = conv3x3_fields(cin, cout);
        g.set_int("cin", cin + 1);
        expect(g.create() == nullptr, "3x3 weights of the wrong size refused");
    }
    {
        Fields g = tail_fields(cin, cout);
        g.add("kernel_size", std::vector<int32_t>{3}, PluginFieldType::kINT32);
        expect(g.create() == nullptr, "kernel_size 3 with 1x1 weights refused");
    }

    // ---- the chained next conv (next_* fields): two outputs, RCV5 with the next flag 1, on a tail or a fused layer
    int const next_cout = 48;
    Fields chained = tail_fields(cin, cout);
    add_next(&chained, cout, next_cout);
    IPluginV2DynamicExt* n = chained.create();
    expect(n != nullptr, "tail with a next conv created");
    if (!n) return 1;
    std::vector<char> nb = blob(n);
    int32_t next_flag = 0;
    std::memcpy(&next_flag, nb.data() + tb.size() - ks, ks);   // the tail's bytes, then the next conv's
    expect(tag(nb) == 0x52435635 && next_flag == 1 && nb.size() > tb.size() + static_cast<size_t>(cout) * next_cout,
           "tail with a next conv serializes as RCV5 with the next flag");
    IPluginV2DynamicExt* n2 = deserialize(nb);
    expect(n2 && blob(n2) == nb, "tail with a next conv round trip");
    expect(n2 && n2->getNbOutputs() == 2 && t->getNbOutputs() == 1, "the next conv is a second output");
    PluginTensorDesc io4[4]{};
    for (auto& d : io4) {
        d.type = DataType::kINT8;
        d.format = TensorFormat::kCHW32;
    }
    expect(n2 && n2->supportsFormatCombination(3, io4, 2, 2) && !n2->supportsFormatCombination(2, io4, 2, 1),
           "tail with a next conv: [x, r] -> [out, next_out], kCHW32");
    std::vector<char> cut_next(nb.begin(), nb.end() - 1), next_flag_only(tb);
    std::memcpy(next_flag_only.data() + tb.size() - ks, &next_flag, ks);   // the flag set without the next fields
    expect(!deserialize(cut_next) && !deserialize(next_flag_only), "bad next-conv blobs refused");
    {
        Fields g = fused_fields(pcin, cin, cout, 2);
        add_next(&g, cout, next_cout);
        IPluginV2DynamicExt* fn = g.create();
        expect(fn && fn->getNbOutputs() == 2, "fused with a next conv created");
        IPluginV2DynamicExt* fn2 = fn ? deserialize(blob(fn)) : nullptr;
        expect(fn2 && blob(fn2) == blob(fn), "fused with a next conv round trip");
        for (IPluginV2DynamicExt* p : {fn, fn2})
            if (p) p->destroy();
    }
    for (char const* name : {"next_weights", "next_w_scale", "next_bias", "next_x_scale", "next_out_scale",
                             "next_cout", "next_relu"}) {
        Fields g = tail_fields(cin, cout);
        add_next(&g, cout, next_cout);
        g.drop(name);
        expect(g.create() == nullptr, std::string("missing ") + name + " refused");
    }
    {
        Fields g = tail_fields(cin, cout);
        g.set_float("r_scale", 0.f);   // a projection (no residual input): not a tail
        add_next(&g, cout, next_cout);
        expect(g.create() == nullptr, "a next conv on a layer without a residual refused");
    }
    {
        Fields g = conv3x3_fields(cin, cout);
        add_next(&g, cout, next_cout);
        expect(g.create() == nullptr, "a next conv on a 3x3 layer refused");
    }
    {
        Fields g = tail_fields(cin, cout);
        add_next(&g, cout, next_cout);
        g.set_int("next_cout", next_cout + 1);
        expect(g.create() == nullptr, "next_weights of the wrong size refused");
    }
    {
        Fields g = tail_fields(cin, cout);
        add_next(&g, cout, next_cout);
        g.set_float("next_out_scale", -1.f);
        expect(g.create() == nullptr, "bad next_out_scale refused");
    }
    {
        Fields g = tail_fields(cin, cout);
        add_next(&g, cout, next_cout);
        g.set_int("next_relu", 2);
        expect(g.create() == nullptr, "next_relu 2 refused");
    }

    // ---- the stem with the next conv chained (ResNet-50's layer1.0 conv1): input [x] kLINEAR, outputs [out,
    // next_out] kCHW32 (next_out on the pooled grid), RCV5 with kernel_size 7 and the next flag 1
    int const stem_cin = 3, stem_cout = 64;
    Fields stem = stem_fields(stem_cin, stem_cout);
    IPluginV2DynamicExt* s0 = stem.create();
    expect(s0 != nullptr && s0->getNbOutputs() == 1, "stem created, one output");
    if (!s0) return 1;
    std::vector<char> sb = blob(s0);
    Fields stem_next = stem_fields(stem_cin, stem_cout);
    add_next(&stem_next, stem_cout, stem_cout);
    IPluginV2DynamicExt* sn = stem_next.create();
    expect(sn != nullptr && sn->getNbOutputs() == 2, "stem with a next conv created, two outputs");
    if (!sn) return 1;
    std::vector<char> snb = blob(sn);
    int32_t stem_ks = 0, stem_next_flag = 0;
    std::memcpy(&stem_ks, sb.data() + sb.size() - 2 * ks, ks);
    std::memcpy(&stem_next_flag, snb.data() + sb.size() - ks, ks);   // the stem's bytes, then the next conv's
    expect(tag(snb) == 0x52435635 && stem_ks == 7 && stem_next_flag == 1 &&
               std::equal(sb.begin(), sb.end() - static_cast<long>(ks), snb.begin()) &&
               snb.size() > sb.size() + static_cast<size_t>(stem_cout) * stem_cout,
           "stem with a next conv serializes as RCV5 with kernel_size 7 and the next flag");
    IPluginV2DynamicExt* sn2 = deserialize(snb);
    expect(sn2 && blob(sn2) == snb && sn2->getNbOutputs() == 2, "stem with a next conv round trip");
    PluginTensorDesc sio[3]{};
    for (auto& d : sio) {
        d.type = DataType::kINT8;
        d.format = TensorFormat::kCHW32;
    }
    sio[0].format = TensorFormat::kLINEAR;
    bool formats = sn2 && sn2->supportsFormatCombination(0, sio, 1, 2) &&
                   sn2->supportsFormatCombination(1, sio, 1, 2) && sn2->supportsFormatCombination(2, sio, 1, 2) &&
                   !sn2->supportsFormatCombination(2, sio, 1, 1);
    sio[2].format = TensorFormat::kLINEAR;
    formats = formats && sn2 && !sn2->supportsFormatCombination(2, sio, 1, 2);
    sio[0].format = TensorFormat::kCHW32;
    formats = formats && sn2 && !sn2->supportsFormatCombination(0, sio, 1, 2);
    expect(formats, "stem with a next conv: [x] kLINEAR -> [out, next_out] kCHW32");
    expect(sn2 && sn2->getWorkspaceSize(sio, 1, sio + 1, 2) == 0, "stem with a next conv needs no workspace");
    std::vector<char> stem_cut(snb.begin(), snb.end() - 1);
    expect(!deserialize(stem_cut), "a cut stem + next blob refused");
    {
        Fields g = stem_fields(stem_cin, stem_cout);
        add_next(&g, stem_cout, 96);   // wider than the stem kernel's N tile: accepted (next_forward: two launches)
        IPluginV2DynamicExt* w96 = g.create();
        expect(w96 && w96->getNbOutputs() == 2, "stem with a next conv of 96 channels created");
        if (w96) w96->destroy();
    }
    {
        Fields g = stem_fields(stem_cin, 40);
        add_next(&g, 40, 32);   // a stem of 40 channels (padded slab), its next conv's cin 40
        IPluginV2DynamicExt* s40 = g.create();
        expect(s40 != nullptr, "stem of 40 channels with a next conv of 32 created");
        if (s40) s40->destroy();
    }
    {
        Fields g = stem_fields(stem_cin, stem_cout);
        add_next(&g, 32, stem_cout);   // next_weights [64][32]: its cin is not the stem's cout
        expect(g.create() == nullptr, "stem: next_weights of another cin refused");
    }
    {
        Fields g = stem_fields(stem_cin, stem_cout);
        add_next(&g, stem_cout, stem_cout);
        g.drop("next_relu");
        expect(g.create() == nullptr, "stem: missing next_relu refused");
    }

    // ---- configurePlugin: what it refuses (stderr: the Python test reads the reasons)
    configure(f, {desc(-1, cin, -1, -1), desc(-1, pcin + 4, -1, -1)});   // xp channels
    configure(f, {desc(-1, cin, 4, 4), desc(-1, pcin, 9, 9)});           // 4 != ceil(9 / 2)
    configure(f, {desc(-1, cin + 1, 5, 5), desc(-1, pcin, 9, 9)});       // x channels
    configure(f, {desc(-1, cin, 5, 5)});                                  // one input
    configure(f, {desc(-1, cin, 5, 5), desc(-1, pcin, 9, 10)});          // accepted: nothing printed
    configure(n, {desc(-1, cin, 5, 5), desc(-1, cout, 5, 5)});           // the next conv's output missing
    configure(n, {desc(-1, cin, 5, 5), desc(-1, cout, 5, 5)}, 2);        // accepted: nothing printed
    configure(sn, {desc(-1, stem_cin, 224, 224)});                         // the stem's next conv output missing
    configure(sn, {desc(-1, stem_cin, 224, 224)}, 2);                      // accepted: nothing printed
    std::printf("failures %d\n", failures);
    for (IPluginV2DynamicExt* p : {t, t2, f, f2, c3, c32, n, n2, s0, sn, sn2})
        if (p) p->destroy();
    return failures;
}
