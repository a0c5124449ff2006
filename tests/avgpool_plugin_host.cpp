// Host-only checks of plugins/avgpool/avgpool_plugin.cpp: no GPU, no libnvinfer (only TensorRT's headers and the
// kernels library, which the plugin's enqueue links against). The creator (name, version 3, no fields, x_scale
// refused), the outputs (two, hi and lo, both int8; version 2's one-output layout refused) and formats (int8 kCHW32
// in, int8 kLINEAR for both outputs), the serialization (the "TAV3" magic, round trip; version 1's "TAVP" and version
// 2's "TAV2" blobs, a foreign, truncated or longer blob refused).
// Built and run by tests/test_avgpool.py; prints "ok NAME" / "FAIL NAME" and exits with the failures.
#include <NvInferRuntime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "plugin_host_creator.h"   // host_creator() instead of the registry
#include "avgpool/avgpool_plugin.cpp"

using namespace nvinfer1;
using trtfuse::avgpool::host_creator;

namespace {

int failures = 0;

void expect(bool ok, std::string const& what) {
    std::printf("%s %s\n", ok ? "ok" : "FAIL", what.c_str());
    failures += !ok;
}

IPluginV2DynamicExt* create(PluginFieldCollection const* fc) {
    return static_cast<IPluginV2DynamicExt*>(host_creator()->createPlugin("host", fc));
}

PluginTensorDesc desc(DataType type, TensorFormat format, int nb_dims) {
    PluginTensorDesc d{};
    d.dims.nbDims = nb_dims;
    for (int i = 0; i < nb_dims; ++i) d.dims.d[i] = i < 2 ? 64 : 7;   // [64, 64, 7, 7]
    d.type = type;
    d.format = format;
    d.scale = 1.f;
    return d;
}

// [x, hi, lo]
bool supports(IPluginV2DynamicExt* p, int pos, PluginTensorDesc in, PluginTensorDesc hi, PluginTensorDesc lo) {
    PluginTensorDesc io[3] = {in, hi, lo};
    return p->supportsFormatCombination(pos, io, 1, 2);
}

// the old single-output layout [x, out]: refused whatever the types
bool supports_one_output(IPluginV2DynamicExt* p, int pos, PluginTensorDesc in, PluginTensorDesc out) {
    PluginTensorDesc io[2] = {in, out};
    return p->supportsFormatCombination(pos, io, 1, 1);
}

std::vector<char> blob_of(IPluginV2DynamicExt const* p) {
    std::vector<char> b(p->getSerializationSize());
    p->serialize(b.data());
    return b;
}

IPluginV2* from_blob(std::vector<char> const& b) { return host_creator()->deserializePlugin("host", b.data(), b.size()); }

}  // namespace

int main() {
    IPluginCreator* c = host_creator();
    expect(std::string(c->getPluginName()) == "TrtfuseAvgPool", "creator name");
    expect(std::string(c->getPluginVersion()) == "3", "creator version 3");
    expect(c->getFieldNames() && c->getFieldNames()->nbFields == 0, "no fields declared");

    PluginFieldCollection none{};
    IPluginV2DynamicExt* p = create(&none);
    expect(p != nullptr, "created from no fields");
    if (!p) return std::printf("failures %d\n", failures + 1), 1;
    IPluginV2DynamicExt* q = create(nullptr);
    expect(q != nullptr, "created from a null field collection");
    if (q) q->destroy();
    float const old_scale = 0.02f;
    PluginField old_field{"x_scale", &old_scale, PluginFieldType::kFLOAT32, 1};
    PluginFieldCollection old_fc{1, &old_field};
    std::fprintf(stderr, "--- x_scale\n");
    expect(create(&old_fc) == nullptr, "x_scale (version 1's field) refused");
    int32_t const other = 3;
    PluginField other_field{"something_else", &other, PluginFieldType::kINT32, 1};
    PluginFieldCollection other_fc{1, &other_field};
    IPluginV2DynamicExt* r = create(&other_fc);
    expect(r != nullptr, "another field ignored");
    if (r) r->destroy();

    expect(std::string(p->getPluginType()) == "TrtfuseAvgPool" && std::string(p->getPluginVersion()) == "3",
           "plugin type and version");
    expect(p->getNbOutputs() == 2, "two outputs (hi, lo)");
    DataType const in_type = DataType::kINT8;
    expect(p->getOutputDataType(0, &in_type, 1) == DataType::kINT8, "output 0 (hi) type int8");
    expect(p->getOutputDataType(1, &in_type, 1) == DataType::kINT8, "output 1 (lo) type int8");

    PluginTensorDesc const x = desc(DataType::kINT8, TensorFormat::kCHW32, 4);
    PluginTensorDesc const y = desc(DataType::kINT8, TensorFormat::kLINEAR, 4);
    PluginTensorDesc const yf = desc(DataType::kFLOAT, TensorFormat::kLINEAR, 4);
    PluginTensorDesc const yh = desc(DataType::kHALF, TensorFormat::kLINEAR, 4);
    PluginTensorDesc const y32 = desc(DataType::kINT8, TensorFormat::kCHW32, 4);
    expect(supports(p, 0, x, y, y), "input int8 kCHW32 [N, C, H, W]");
    expect(!supports(p, 0, desc(DataType::kINT8, TensorFormat::kLINEAR, 4), y, y), "input int8 kLINEAR refused");
    expect(!supports(p, 0, desc(DataType::kFLOAT, TensorFormat::kLINEAR, 4), y, y), "input float refused");
    expect(!supports(p, 0, desc(DataType::kINT8, TensorFormat::kCHW32, 3), y, y), "input of 3 dims refused");
    for (int pos = 1; pos <= 2; ++pos) {
        std::string const o = pos == 1 ? "output hi" : "output lo";
        expect(supports(p, pos, x, y, y), o + " int8 kLINEAR");
        expect(!supports(p, pos, x, pos == 1 ? yf : y, pos == 2 ? yf : y), o + " float refused");
        expect(!supports(p, pos, x, pos == 1 ? yh : y, pos == 2 ? yh : y), o + " half refused");
        expect(!supports(p, pos, x, pos == 1 ? y32 : y, pos == 2 ? y32 : y), o + " int8 kCHW32 refused");
    }
    std::fprintf(stderr, "--- one output\n");
    expect(!supports_one_output(p, 0, x, y) && !supports_one_output(p, 1, x, y),
           "version 2's layout (one int8 output) refused");
    PluginTensorDesc const outs[2] = {y, y};
    expect(p->getWorkspaceSize(&x, 1, outs, 2) == 0, "no workspace");

    p->setPluginNamespace("ns");
    std::vector<char> const b = blob_of(p);
    expect(b.size() == 4 && std::memcmp(b.data(), "TAV3", 4) == 0, "blob is the magic TAV3, 4 bytes");
    IPluginV2* back = from_blob(b);
    expect(back != nullptr, "TAV3 blob read back");
    if (back) {
        auto* d = static_cast<IPluginV2DynamicExt*>(back);
        expect(blob_of(d) == b, "round trip: the same blob again");
        DataType t = DataType::kINT8;
        expect(d->getNbOutputs() == 2 && d->getOutputDataType(0, &t, 1) == DataType::kINT8 &&
                   d->getOutputDataType(1, &t, 1) == DataType::kINT8 && supports(d, 1, x, y, y) &&
                   supports(d, 2, x, y, y),
               "round trip: still two int8 kLINEAR outputs");
        back->destroy();
    }
    IPluginV2DynamicExt* cl = p->clone();
    expect(cl != nullptr && std::string(cl->getPluginNamespace()) == "ns" && blob_of(cl) == b,
           "clone: namespace and blob kept");
    if (cl) cl->destroy();

    std::fprintf(stderr, "--- blobs\n");
    std::vector<char> v1(8);
    float const s = 0.02f;
    std::memcpy(v1.data(), "TAVP", 4);
    std::memcpy(v1.data() + 4, &s, 4);
    expect(from_blob(v1) == nullptr, "version 1 blob (TAVP + x_scale) refused");
    std::vector<char> v2(4);
    std::memcpy(v2.data(), "TAV2", 4);
    expect(from_blob(v2) == nullptr, "version 2 blob (TAV2, one int8 output) refused");
    std::vector<char> foreign(b);
    foreign[3] = 'X';
    expect(from_blob(foreign) == nullptr, "foreign magic refused");
    expect(from_blob(std::vector<char>(b.begin(), b.begin() + 2)) == nullptr, "truncated blob refused");
    std::vector<char> longer(b);
    longer.push_back(0);
    expect(from_blob(longer) == nullptr, "blob with trailing bytes refused");
    p->destroy();

    std::printf("failures %d\n", failures);
    return failures;
}
