// TensorRT plugin TrtfuseResidualConv (IPluginV2DynamicExt): a thin layer over the C ABI in residual_conv.h.
// It validates, (de)serializes the fields and calls trtfuse_residual_conv_forward, the same function the
// tests call, so an IPluginV3 version can sit beside it without touching the kernels.
//
// I/O: inputs x [N, cin, H, W] and r [N, cout, Ho, Wo], output [N, cout, Ho, Wo] (Ho = ceil(H / stride), Wo the
// same), all INT8 in TensorRT's kCHW32 format (the only combination supportsFormatCombination accepts). With
// r_scale = 0 the layer has no residual input and x is the only input (a projection: relu 0; a bottleneck's conv1:
// relu 1). In an explicitly quantized network TensorRT passes no scales to plugins, so x_scale, r_scale and
// out_scale are fields; stride (1 or 2, optional, default 1) too.
#include <NvInfer.h>
#include <NvInferRuntime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/serialize.h"
#include "residual_conv/residual_conv.h"

using namespace nvinfer1;

namespace trtfuse {
namespace {

constexpr char const* kName = "TrtfuseResidualConv";
constexpr char const* kVersion = "1";
constexpr uint32_t kSerialTag = 0x52435632;   // "RCV2": the fields with stride; refuses foreign blobs
constexpr uint32_t kSerialTagV1 = 0x52435631; // "RCV1": engines built before stride (read as stride 1)

// Refusals go to stderr with the reason: TensorRT 8.5 gives plugins no logger of their own.
void refuse(std::string const& why) { std::fprintf(stderr, "trtfuse: %s refused: %s\n", kName, why.c_str()); }

struct Fields {
    int cin = 0, cout = 0, relu = 1, stride = 1;
    float x_scale = 0, r_scale = 0, out_scale = 0;
    std::vector<int8_t> weights;
    std::vector<float> w_scale, bias;

    bool valid(std::string* why) const {
        if (static_cast<int64_t>(weights.size()) != static_cast<int64_t>(cin) * cout || cin <= 0 || cout <= 0) {
            *why = "weights must hold cin * cout values (cin, cout > 0)";
            return false;
        }
        if (static_cast<int>(w_scale.size()) != cout || static_cast<int>(bias.size()) != cout) {
            *why = "w_scale and bias must hold cout values";
            return false;
        }
        int st = trtfuse_conv1x1_check(cin, cout, weights.data(), w_scale.data(), bias.data(), x_scale, r_scale,
                                       out_scale, stride);
        if (st != 0) {
            *why = trtfuse_residual_conv_error_string(st);
            return false;
        }
        return true;
    }
    bool residual() const { return r_scale != 0.f; }
    int inputs() const { return residual() ? 2 : 1; }
};

class ResidualConvPlugin : public IPluginV2DynamicExt {
public:
    explicit ResidualConvPlugin(Fields f) : f_(std::move(f)) {}

    ResidualConvPlugin(void const* data, size_t length) {
        Reader r(data, length);
        uint32_t const tag = r.get<uint32_t>();
        if (tag != kSerialTag && tag != kSerialTagV1) throw std::runtime_error("not a TrtfuseResidualConv blob");
        f_.cin = r.get<int32_t>();
        f_.cout = r.get<int32_t>();
        f_.relu = r.get<int32_t>();
        f_.stride = tag == kSerialTag ? r.get<int32_t>() : 1;
        f_.x_scale = r.get<float>();
        f_.r_scale = r.get<float>();
        f_.out_scale = r.get<float>();
        f_.weights = r.getVector<int8_t>();
        f_.w_scale = r.getVector<float>();
        f_.bias = r.getVector<float>();
        std::string why;
        if (!r.done() || !f_.valid(&why)) throw std::runtime_error("bad TrtfuseResidualConv blob: " + why);
    }

    ~ResidualConvPlugin() override { terminate(); }

    // ---- IPluginV2 ----
    AsciiChar const* getPluginType() const noexcept override { return kName; }
    AsciiChar const* getPluginVersion() const noexcept override { return kVersion; }
    int32_t getNbOutputs() const noexcept override { return 1; }

    int32_t initialize() noexcept override {
        if (handle_) return 0;
        int st = trtfuse_conv1x1_create(f_.cin, f_.cout, f_.weights.data(), f_.w_scale.data(), f_.bias.data(),
                                        f_.x_scale, f_.r_scale, f_.out_scale, f_.relu, f_.stride, &handle_);
        if (st != 0) refuse(std::string("initialize: ") + trtfuse_residual_conv_error_string(st));
        return st;
    }
    void terminate() noexcept override {
        if (handle_) trtfuse_residual_conv_destroy(handle_);
        handle_ = nullptr;
    }

    size_t getSerializationSize() const noexcept override {
        return sizeof(uint32_t) + 4 * sizeof(int32_t) + 3 * sizeof(float) + serializedSize(f_.weights) +
               serializedSize(f_.w_scale) + serializedSize(f_.bias);
    }
    void serialize(void* buffer) const noexcept override {
        Writer w(buffer);
        w.put<uint32_t>(kSerialTag);
        w.put<int32_t>(f_.cin);
        w.put<int32_t>(f_.cout);
        w.put<int32_t>(f_.relu);
        w.put<int32_t>(f_.stride);
        w.put<float>(f_.x_scale);
        w.put<float>(f_.r_scale);
        w.put<float>(f_.out_scale);
        w.put(f_.weights);
        w.put(f_.w_scale);
        w.put(f_.bias);
    }
    void destroy() noexcept override { delete this; }
    void setPluginNamespace(AsciiChar const* ns) noexcept override { ns_ = ns ? ns : ""; }
    AsciiChar const* getPluginNamespace() const noexcept override { return ns_.c_str(); }

    // ---- IPluginV2Ext ----
    DataType getOutputDataType(int32_t, DataType const*, int32_t) const noexcept override { return DataType::kINT8; }

    // ---- IPluginV2DynamicExt ----
    IPluginV2DynamicExt* clone() const noexcept override {
        try {
            auto* p = new ResidualConvPlugin(f_);   // device weights are made by the clone's initialize()
            p->setPluginNamespace(ns_.c_str());
            return p;
        } catch (...) {
            return nullptr;
        }
    }

    DimsExprs getOutputDimensions(int32_t index, DimsExprs const* inputs, int32_t nbInputs,
                                  IExprBuilder& builder) noexcept override {
        DimsExprs out = inputs[0];
        if (index != 0 || nbInputs != f_.inputs() || inputs[0].nbDims != 4) return out;
        out.d[1] = builder.constant(f_.cout);
        if (f_.stride != 1) {   // no padding: ceil(H / stride) x ceil(W / stride)
            IDimensionExpr const* s = builder.constant(f_.stride);
            out.d[2] = builder.operation(DimensionOperation::kCEIL_DIV, *inputs[0].d[2], *s);
            out.d[3] = builder.operation(DimensionOperation::kCEIL_DIV, *inputs[0].d[3], *s);
        }
        return out;
    }

    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* inOut, int32_t nbInputs,
                                   int32_t nbOutputs) noexcept override {
        if (nbInputs != f_.inputs() || nbOutputs != 1 || pos < 0 || pos > nbInputs) return false;
        // INT8 kCHW32 everywhere: the kernels read and write 32-channel blocks directly.
        return inOut[pos].type == DataType::kINT8 && inOut[pos].format == TensorFormat::kCHW32;
    }

    void configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out,
                         int32_t nbOutputs) noexcept override {
        if (nbInputs != f_.inputs() || nbOutputs != 1)
            return refuse(f_.residual() ? "expects inputs [x, r] and one output (r_scale > 0)"
                                        : "expects input [x] and one output (r_scale = 0: no residual input)");
        Dims const& x = in[0].desc.dims;
        if (x.nbDims != 4) return refuse("x must be 4-D NCHW");
        if (x.d[1] != -1 && x.d[1] != f_.cin) refuse("x has " + std::to_string(x.d[1]) + " channels, cin = " +
                                                     std::to_string(f_.cin));
        if (!f_.residual()) return;
        Dims const& r = in[1].desc.dims;
        if (r.nbDims != 4) return refuse("r must be 4-D NCHW");
        if (r.d[1] != -1 && r.d[1] != f_.cout) refuse("r has " + std::to_string(r.d[1]) + " channels, cout = " +
                                                      std::to_string(f_.cout));
        // r is the output's size: x's N, and its H and W divided by the stride (rounded up)
        for (int i : {0, 2, 3}) {
            int64_t const want = x.d[i] == -1 || i == 0 ? x.d[i] : (x.d[i] + f_.stride - 1) / f_.stride;
            if (want != -1 && r.d[i] != -1 && r.d[i] != want) refuse("r must be [N, cout, ceil(H/stride), ceil(W/stride)]");
        }
    }

    size_t getWorkspaceSize(PluginTensorDesc const*, int32_t, PluginTensorDesc const*, int32_t) const noexcept override {
        return 0;
    }

    int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
                    void const* const* inputs, void* const* outputs, void* /*workspace*/,
                    cudaStream_t stream) noexcept override {
        if (!handle_) {
            if (int st = initialize()) return st;
        }
        Dims const& d = inputDesc[0].dims;
        if (d.nbDims != 4 || d.d[1] != f_.cin || (f_.residual() && inputDesc[1].dims.d[1] != f_.cout)) {
            refuse("enqueue: unexpected input shapes");
            return -1;
        }
        int st = trtfuse_residual_conv_forward(handle_, inputs[0], f_.residual() ? inputs[1] : nullptr, outputs[0],
                                               d.d[0], d.d[2], d.d[3], -1, stream);
        if (st != 0) refuse(std::string("enqueue: ") + trtfuse_residual_conv_error_string(st));
        return st;
    }

private:
    // The implicit-batch overloads of IPluginV2/IPluginV2Ext stay hidden on purpose.
    using IPluginV2::enqueue;
    using IPluginV2::getOutputDimensions;
    using IPluginV2::getWorkspaceSize;
    using IPluginV2Ext::configurePlugin;

    Fields f_;
    std::string ns_;
    void* handle_ = nullptr;
};

// ---- creator ----
class ResidualConvCreator : public IPluginCreator {
public:
    ResidualConvCreator() {
        attrs_ = {
            PluginField("weights", nullptr, PluginFieldType::kINT8, 0),
            PluginField("w_scale", nullptr, PluginFieldType::kFLOAT32, 0),
            PluginField("bias", nullptr, PluginFieldType::kFLOAT32, 0),
            PluginField("x_scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("r_scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("out_scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("relu", nullptr, PluginFieldType::kINT32, 1),
            PluginField("cin", nullptr, PluginFieldType::kINT32, 1),
            PluginField("cout", nullptr, PluginFieldType::kINT32, 1),
            PluginField("stride", nullptr, PluginFieldType::kINT32, 1),
        };
        fc_.nbFields = static_cast<int32_t>(attrs_.size());
        fc_.fields = attrs_.data();
    }

    AsciiChar const* getPluginName() const noexcept override { return kName; }
    AsciiChar const* getPluginVersion() const noexcept override { return kVersion; }
    PluginFieldCollection const* getFieldNames() noexcept override { return &fc_; }

    IPluginV2* createPlugin(AsciiChar const* /*name*/, PluginFieldCollection const* fc) noexcept override {
        try {
            Fields f;
            bool seen[10] = {};
            for (int i = 0; fc && i < fc->nbFields; ++i) {
                PluginField const& p = fc->fields[i];
                std::string n = p.name ? p.name : "";
                if (n == "weights") {
                    if (!read_weights(p, &f.weights)) return nullptr;
                    seen[0] = true;
                } else if (n == "w_scale") {
                    if (!read_floats(p, &f.w_scale)) return nullptr;
                    seen[1] = true;
                } else if (n == "bias") {
                    if (!read_floats(p, &f.bias)) return nullptr;
                    seen[2] = true;
                } else if (n == "x_scale" || n == "r_scale" || n == "out_scale") {
                    std::vector<float> v;
                    if (!read_floats(p, &v) || v.size() != 1) return refuse(n + " must be one float"), nullptr;
                    (n == "x_scale" ? f.x_scale : n == "r_scale" ? f.r_scale : f.out_scale) = v[0];
                    seen[n == "x_scale" ? 3 : n == "r_scale" ? 4 : 5] = true;
                } else if (n == "relu" || n == "cin" || n == "cout" || n == "stride") {
                    if (p.type != PluginFieldType::kINT32 || p.length != 1 || !p.data)
                        return refuse(n + " must be one INT32"), nullptr;
                    int v = *static_cast<int32_t const*>(p.data);
                    (n == "relu" ? f.relu : n == "cin" ? f.cin : n == "cout" ? f.cout : f.stride) = v;
                    seen[n == "relu" ? 6 : n == "cin" ? 7 : n == "cout" ? 8 : 9] = true;
                }
                // other fields (plugin_version, plugin_namespace, ...) are not ours: ignored
            }
            for (int i = 0; i < 9; ++i)   // relu (6) and stride (9) are optional
                if (!seen[i] && i != 6) return refuse(std::string("missing field ") + attrs_[i].name), nullptr;
            if (f.relu != 0 && f.relu != 1) return refuse("relu must be 0 or 1"), nullptr;
            std::string why;
            if (!f.valid(&why)) return refuse(why), nullptr;
            auto* plugin = new ResidualConvPlugin(std::move(f));
            plugin->setPluginNamespace(ns_.c_str());
            return plugin;
        } catch (std::exception const& e) {
            refuse(e.what());
            return nullptr;
        }
    }

    IPluginV2* deserializePlugin(AsciiChar const* /*name*/, void const* data, size_t length) noexcept override {
        try {
            auto* plugin = new ResidualConvPlugin(data, length);
            plugin->setPluginNamespace(ns_.c_str());
            return plugin;
        } catch (std::exception const& e) {
            refuse(e.what());
            return nullptr;
        }
    }

    void setPluginNamespace(AsciiChar const* ns) noexcept override { ns_ = ns ? ns : ""; }
    AsciiChar const* getPluginNamespace() const noexcept override { return ns_.c_str(); }

private:
    // weights: INT8, or INT32 / FLOAT holding integers in [-127, 127] (ONNX attributes arrive as those).
    static bool read_weights(PluginField const& p, std::vector<int8_t>* out) {
        if (!p.data || p.length <= 0) return refuse("weights is empty"), false;
        out->resize(p.length);
        for (int32_t i = 0; i < p.length; ++i) {
            double v;
            if (p.type == PluginFieldType::kINT8) v = static_cast<int8_t const*>(p.data)[i];
            else if (p.type == PluginFieldType::kINT32) v = static_cast<int32_t const*>(p.data)[i];
            else if (p.type == PluginFieldType::kFLOAT32) v = static_cast<float const*>(p.data)[i];
            else return refuse("weights must be INT8, INT32 or FLOAT"), false;
            if (!(v >= -127 && v <= 127) || v != static_cast<int>(v))
                return refuse("weights must be integers in [-127, 127]"), false;
            (*out)[i] = static_cast<int8_t>(v);
        }
        return true;
    }
    static bool read_floats(PluginField const& p, std::vector<float>* out) {
        if (p.type != PluginFieldType::kFLOAT32 || !p.data || p.length <= 0)
            return refuse(std::string(p.name) + " must be FLOAT"), false;
        out->assign(static_cast<float const*>(p.data), static_cast<float const*>(p.data) + p.length);
        return true;
    }

    std::vector<PluginField> attrs_;
    PluginFieldCollection fc_{};
    std::string ns_;
};

}  // namespace
}  // namespace trtfuse

using trtfuse::ResidualConvCreator;
REGISTER_TENSORRT_PLUGIN(ResidualConvCreator);
