// Byte-buffer (de)serialization of plugin fields: plain values and vectors, with bounds checks
// on read so a truncated or foreign blob is refused rather than read past its end.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace trtfuse {

class Writer {
public:
    explicit Writer(void* buffer) : p_(static_cast<char*>(buffer)) {}
    template <typename T> void put(T const& v) {
        static_assert(std::is_trivially_copyable<T>::value, "POD only");
        std::memcpy(p_, &v, sizeof(T));
        p_ += sizeof(T);
    }
    template <typename T> void put(std::vector<T> const& v) {
        put<uint64_t>(v.size());
        if (!v.empty()) std::memcpy(p_, v.data(), v.size() * sizeof(T));
        p_ += v.size() * sizeof(T);
    }
private:
    char* p_;
};

class Reader {
public:
    Reader(void const* data, size_t length)
        : p_(static_cast<char const*>(data)), end_(p_ + length) {}
    template <typename T> T get() {
        static_assert(std::is_trivially_copyable<T>::value, "POD only");
        need(sizeof(T));
        T v;
        std::memcpy(&v, p_, sizeof(T));
        p_ += sizeof(T);
        return v;
    }
    template <typename T> std::vector<T> getVector() {
        uint64_t n = get<uint64_t>();
        need(n * sizeof(T));
        std::vector<T> v(n);
        if (n) std::memcpy(v.data(), p_, n * sizeof(T));
        p_ += n * sizeof(T);
        return v;
    }
    bool done() const { return p_ == end_; }
private:
    void need(size_t n) const {
        if (static_cast<size_t>(end_ - p_) < n)
            throw std::runtime_error("trtfuse: serialized plugin data is truncated");
    }
    char const* p_;
    char const* end_;
};

template <typename T> constexpr size_t serializedSize(T const&) { return sizeof(T); }
template <typename T> size_t serializedSize(std::vector<T> const& v) {
    return sizeof(uint64_t) + v.size() * sizeof(T);
}

}  // namespace trtfuse
