// TensorRT plugin TrtfuseResidualConv (IPluginV2DynamicExt): a thin layer over the C ABI of the int8 conv library
// (plugins/conv_int8/c_api.h).
// It validates, (de)serializes the fields and calls trtfuse_residual_conv_forward / trtfuse_proj_tail_forward, the
// same functions the tests call, so an IPluginV3 version can sit beside it without touching the kernels.
//
// I/O: inputs x [N, cin, H, W] and r [N, cout, Ho, Wo], output [N, cout, Ho, Wo] (Ho = ceil(H / stride), Wo the
// same), all INT8 in TensorRT's kCHW32 format (the only combination supportsFormatCombination accepts). With
// r_scale = 0 the layer has no residual input and x is the only input (a projection: relu 0; a bottleneck's conv1:
// relu 1). In an explicitly quantized network TensorRT passes no scales to plugins, so x_scale, r_scale and
// out_scale are fields; stride (1 or 2, optional, default 1) too.
//
// With the proj_* fields (all or none: proj_weights [cout][proj_cin], proj_w_scale, proj_bias, proj_x_scale,
// proj_out_scale, proj_cin; proj_stride optional, default 1) the layer is a stage's first block in one kernel: its
// tail (stride 1, r_scale > 0) whose residual is its projection (no ReLU, no residual) of a second input. Inputs
// x [N, cin, Ho, Wo] (the tail's) and xp [N, proj_cin, H, W] (the block input), output [N, cout, Ho, Wo]
// (Ho = ceil(H / proj_stride)); the projection's int8 output never goes to memory where the fused kernel runs, else
// it goes through TensorRT's workspace (getWorkspaceSize).
//
// With kernel_size = 3 (optional, default 1) the layer is a 3x3 conv (padding 1, stride 1 or 2) + BN (+ReLU) without a
// residual: weights [cout][cin][3][3], input x [N, cin, H, W], output [N, cout, Ho, Wo] (the sm_90a halo kernel,
// conv_int8/kernels/conv3x3_sm90.cuh; r_scale must be 0 and there are no proj_* fields).
//
// With kernel_size = 7 the layer is the ResNet stem: a 7x7 conv (stride 2, padding 3) + BN (+ReLU) + 3x3 max pool
// (stride 2, padding 1), weights [cout][cin][7][7] (cin <= 4, cout <= 64), stride 2, r_scale 0, no proj_* fields. Its
// input x [N, cin, H, W] is INT8 kLINEAR (the network's input as the host sends it: no reformat), W a multiple of 16;
// output [N, cout, ceil(ceil(H/2)/2), ceil(ceil(W/2)/2)] kCHW32 (conv_int8/kernels/stem_sm90.cuh).
//
// With the next_* fields (all or none: next_weights [next_cout][cout], next_w_scale, next_bias, next_x_scale,
// next_out_scale, next_cout, next_relu) a tail (kernel_size 1, stride 1, r_scale > 0, with or without the proj_*
// fields) or the stem (kernel_size 7) also computes the next bottleneck's conv1 (1x1, stride 1, no residual; its cin
// the layer's cout) of its own output tile: a second output [N, next_cout, Ho, Wo] on output 0's grid (the stem's:
// its pooled grid), INT8 kCHW32, so that conv does not read the layer's output back from memory (trtfuse_next_forward;
// the inputs and output 0 are as without them, the stem's input still kLINEAR). ResNet-50: layer1's tails, and the
// stem with layer1.0's conv1.
//
// Serialization, "RCV5" (read and written): the tag, cin, cout, relu, stride, x_scale, r_scale, out_scale, weights,
// w_scale, bias; an int32 "has projection" flag, then (if set) the projection's cin, stride, x_scale, out_scale,
// weights, w_scale, bias; an int32 kernel_size; an int32 "has next" flag and (if set) the next conv's cout, relu,
// x_scale, out_scale, weights, w_scale, bias. Blobs of the older formats RCV1-RCV4 are refused (the engine must be
// rebuilt): every engine built since the chained next conv writes RCV5.
#include <NvInfer.h>
#include <NvInferRuntime.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/serialize.h"
#include "conv_int8/c_api.h"

using namespace nvinfer1;

namespace trtfuse {
namespace {

constexpr char const* kName = "TrtfuseResidualConv";
constexpr char const* kVersion = "1";
constexpr uint32_t kSerialTag = 0x52435635;   // "RCV5", the only format read and written; refuses foreign blobs
constexpr uint32_t kSerialTagOldest = 0x52435631;   // "RCV1" .. "RCV4": older formats, refused with a rebuild hint

// Refusals go to stderr with the reason: TensorRT 8.5 gives plugins no logger of their own.
void refuse(std::string const& why) { std::fprintf(stderr, "trtfuse: %s refused: %s\n", kName, why.c_str()); }

// weights [cout][cin] (taps 9: [cout][cin][3][3]; 49: [cout][cin][7][7]), w_scale and bias [cout]: the sizes the
// C ABI trusts. prefix: "" or "proj_" (field names).
bool sizes_ok(std::vector<int8_t> const& weights, std::vector<float> const& w_scale, std::vector<float> const& bias,
              int cin, int cout, std::string const& prefix, std::string* why, int taps = 1) {
    if (static_cast<int64_t>(weights.size()) != static_cast<int64_t>(taps) * cin * cout || cin <= 0 || cout <= 0) {
        *why = prefix + "weights must hold " + (taps > 1 ? std::to_string(taps) + " * " : "") + prefix +
               "cin * cout values (" + prefix + "cin, cout > 0)";
        return false;
    }
    if (static_cast<int>(w_scale.size()) != cout || static_cast<int>(bias.size()) != cout) {
        *why = prefix + "w_scale and " + prefix + "bias must hold cout values";
        return false;
    }
    return true;
}

// The projection of the fused form (a stage's first block): a 1x1 conv of the block input xp, no ReLU, no residual.
struct Proj {
    int cin = 0, stride = 1;
    float x_scale = 0, out_scale = 0;
    std::vector<int8_t> weights;   // [cout][cin]
    std::vector<float> w_scale, bias;
};

// The next bottleneck's conv1 that a tail or the stem computes too (a second output): 1x1, stride 1, no residual,
// reading the layer's output (its cin is the layer's cout).
struct Next {
    int cout = 0, relu = 1;
    float x_scale = 0, out_scale = 0;
    std::vector<int8_t> weights;   // [cout][the layer's cout]
    std::vector<float> w_scale, bias;
};

struct Fields {
    int cin = 0, cout = 0, relu = 1, stride = 1, kernel_size = 1;
    float x_scale = 0, r_scale = 0, out_scale = 0;
    std::vector<int8_t> weights;
    std::vector<float> w_scale, bias;
    bool has_proj = false;   // the fused form: the residual is proj's output (inputs [x, xp])
    Proj proj;
    bool has_next = false;   // the chained next conv: outputs [out, next_out]
    Next next;

    bool valid(std::string* why) const {
        if (kernel_size != 1 && kernel_size != 3 && kernel_size != 7) {
            *why = "kernel_size must be 1, 3 or 7 (the stem)";
            return false;
        }
        if (!sizes_ok(weights, w_scale, bias, cin, cout, "", why, kernel_size * kernel_size)) return false;
        int st;
        if (kernel_size == 7) {
            if (has_proj || r_scale != 0.f || stride != 2) {
                *why = "the stem (kernel_size 7) has stride 2, no residual input (r_scale 0) and no proj_* fields";
                return false;
            }
            st = trtfuse_stem_check(cin, cout, weights.data(), w_scale.data(), bias.data(), x_scale, out_scale);
        } else if (kernel_size == 3) {
            if (has_proj || r_scale != 0.f) {
                *why = "a 3x3 layer (kernel_size 3) has no residual input (r_scale 0) and no proj_* fields";
                return false;
            }
            st = trtfuse_conv3x3_check(cin, cout, weights.data(), w_scale.data(), bias.data(), x_scale, out_scale,
                                       stride);
        } else if (has_proj) {
            if (!sizes_ok(proj.weights, proj.w_scale, proj.bias, proj.cin, cout, "proj_", why)) return false;
            if (stride != 1) {
                *why = "the tail of a projection + tail layer has stride 1 (proj_stride is the block's)";
                return false;
            }
            if (!(r_scale > 0)) {
                *why = "a projection + tail layer needs r_scale > 0 (the tail's residual: the projection's scale)";
                return false;
            }
            st = trtfuse_proj_tail_check(cin, cout, weights.data(), w_scale.data(), bias.data(), x_scale, r_scale,
                                         out_scale, proj.cin, proj.weights.data(), proj.w_scale.data(),
                                         proj.bias.data(), proj.x_scale, proj.out_scale, proj.stride);
        } else {
            st = trtfuse_conv1x1_check(cin, cout, weights.data(), w_scale.data(), bias.data(), x_scale, r_scale,
                                       out_scale, stride);
        }
        if (st != 0) {
            *why = trtfuse_residual_conv_error_string(st);
            return false;
        }
        return !has_next || next_valid(why);
    }
    // The next_* fields: only a stride-1 1x1 tail (a residual input, or the proj_* fields) or the stem (kernel_size 7,
    // already checked by valid()) chains a next conv, whose input is the layer's output.
    bool next_valid(std::string* why) const {
        bool const tail = kernel_size == 1 && stride == 1 && (residual() || has_proj);
        if (!tail && kernel_size != 7) {
            *why = "next_weights (the next_* fields) given to a layer that is neither a tail nor the stem: they need "
                   "kernel_size 1, stride 1 and a residual input (r_scale > 0) or the proj_* fields, or kernel_size 7 "
                   "(the stem); drop the next_* fields";
            return false;
        }
        if (next.relu != 0 && next.relu != 1) {
            *why = "next_relu must be 0 or 1";
            return false;
        }
        if (next.cout <= 0 || static_cast<int64_t>(next.weights.size()) != static_cast<int64_t>(next.cout) * cout) {
            *why = "next_weights must hold cout * next_cout values (next_cout > 0): [next_cout][cout]";
            return false;
        }
        if (static_cast<int>(next.w_scale.size()) != next.cout || static_cast<int>(next.bias.size()) != next.cout) {
            *why = "next_w_scale and next_bias must hold next_cout values";
            return false;
        }
        int const st = trtfuse_next_check(cout, next.cout, next.weights.data(), next.w_scale.data(), next.bias.data(),
                                          next.x_scale, next.out_scale);
        if (st != 0) {
            *why = std::string("next_* fields: ") + trtfuse_residual_conv_error_string(st);
            return false;
        }
        return true;
    }
    bool residual() const { return r_scale != 0.f; }
    int inputs() const { return residual() || has_proj ? 2 : 1; }
    int outputs() const { return has_next ? 2 : 1; }
};

// `out` is `in` strided: the same N, H and W divided by the stride (rounded up), where both are known.
bool strided_shape(Dims const& in, Dims const& out, int stride) {
    for (int i : {0, 2, 3}) {
        int64_t const want = in.d[i] == -1 || i == 0 ? in.d[i] : (in.d[i] + stride - 1) / stride;
        if (want != -1 && out.d[i] != -1 && out.d[i] != want) return false;
    }
    return true;
}

class ResidualConvPlugin : public IPluginV2DynamicExt {
public:
    explicit ResidualConvPlugin(Fields f) : f_(std::move(f)) {}

    ResidualConvPlugin(void const* data, size_t length) {
        Reader r(data, length);
        uint32_t const tag = r.get<uint32_t>();
        if (tag >= kSerialTagOldest && tag < kSerialTag)
            throw std::runtime_error("a TrtfuseResidualConv blob of an older format (RCV" +
                                     std::to_string((tag & 0xff) - 0x30) + "): rebuild the engine");
        if (tag != kSerialTag) throw std::runtime_error("not a TrtfuseResidualConv blob");
        f_.cin = r.get<int32_t>();
        f_.cout = r.get<int32_t>();
        f_.relu = r.get<int32_t>();
        f_.stride = r.get<int32_t>();
        f_.x_scale = r.get<float>();
        f_.r_scale = r.get<float>();
        f_.out_scale = r.get<float>();
        f_.weights = r.getVector<int8_t>();
        f_.w_scale = r.getVector<float>();
        f_.bias = r.getVector<float>();
        int32_t const has_proj = r.get<int32_t>();
        if (has_proj != 0 && has_proj != 1) throw std::runtime_error("bad TrtfuseResidualConv blob: projection flag");
        f_.has_proj = has_proj == 1;
        if (f_.has_proj) {
            f_.proj.cin = r.get<int32_t>();
            f_.proj.stride = r.get<int32_t>();
            f_.proj.x_scale = r.get<float>();
            f_.proj.out_scale = r.get<float>();
            f_.proj.weights = r.getVector<int8_t>();
            f_.proj.w_scale = r.getVector<float>();
            f_.proj.bias = r.getVector<float>();
        }
        f_.kernel_size = r.get<int32_t>();
        int32_t const has_next = r.get<int32_t>();
        if (has_next != 0 && has_next != 1) throw std::runtime_error("bad TrtfuseResidualConv blob: next flag");
        f_.has_next = has_next == 1;
        if (f_.has_next) {
            f_.next.cout = r.get<int32_t>();
            f_.next.relu = r.get<int32_t>();
            f_.next.x_scale = r.get<float>();
            f_.next.out_scale = r.get<float>();
            f_.next.weights = r.getVector<int8_t>();
            f_.next.w_scale = r.getVector<float>();
            f_.next.bias = r.getVector<float>();
        }
        std::string why = "trailing bytes";
        if (!r.done() || !f_.valid(&why)) throw std::runtime_error("bad TrtfuseResidualConv blob: " + why);
    }

    ~ResidualConvPlugin() override { terminate(); }

    // ---- IPluginV2 ----
    AsciiChar const* getPluginType() const noexcept override { return kName; }
    AsciiChar const* getPluginVersion() const noexcept override { return kVersion; }
    int32_t getNbOutputs() const noexcept override { return f_.outputs(); }

    int32_t initialize() noexcept override { return create(); }
    void terminate() noexcept override {
        if (handle_) trtfuse_residual_conv_destroy(handle_);
        handle_ = nullptr;
    }

    size_t getSerializationSize() const noexcept override {
        size_t size = sizeof(uint32_t) + 5 * sizeof(int32_t) + 3 * sizeof(float) + serializedSize(f_.weights) +
                      serializedSize(f_.w_scale) + serializedSize(f_.bias);
        if (f_.has_proj)
            size += 2 * sizeof(int32_t) + 2 * sizeof(float) + serializedSize(f_.proj.weights) +
                    serializedSize(f_.proj.w_scale) + serializedSize(f_.proj.bias);
        size += 2 * sizeof(int32_t);   // kernel_size, has_next
        if (f_.has_next)
            size += 2 * sizeof(int32_t) + 2 * sizeof(float) + serializedSize(f_.next.weights) +
                    serializedSize(f_.next.w_scale) + serializedSize(f_.next.bias);
        return size;
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
        w.put<int32_t>(f_.has_proj ? 1 : 0);
        if (f_.has_proj) {
            w.put<int32_t>(f_.proj.cin);
            w.put<int32_t>(f_.proj.stride);
            w.put<float>(f_.proj.x_scale);
            w.put<float>(f_.proj.out_scale);
            w.put(f_.proj.weights);
            w.put(f_.proj.w_scale);
            w.put(f_.proj.bias);
        }
        w.put<int32_t>(f_.kernel_size);
        w.put<int32_t>(f_.has_next ? 1 : 0);
        if (f_.has_next) {
            w.put<int32_t>(f_.next.cout);
            w.put<int32_t>(f_.next.relu);
            w.put<float>(f_.next.x_scale);
            w.put<float>(f_.next.out_scale);
            w.put(f_.next.weights);
            w.put(f_.next.w_scale);
            w.put(f_.next.bias);
        }
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
        // the output's grid is the strided grid of x, or of xp in the fused form (x is already on the output's grid)
        DimsExprs out = inputs[f_.has_proj ? 1 : 0];
        int const stride = f_.has_proj ? f_.proj.stride : f_.stride;
        if (index < 0 || index >= f_.outputs() || nbInputs != f_.inputs() || out.nbDims != 4) return out;
        // output 1 (next_* fields): the next conv's, on output 0's grid
        out.d[1] = builder.constant(index == 1 ? f_.next.cout : f_.cout);
        // no padding: ceil(H / stride) x ceil(W / stride); the stem: its conv's, then its max pool's (both stride 2)
        for (int pass = 0; pass < (f_.kernel_size == 7 ? 2 : 1) && stride != 1; ++pass) {
            IDimensionExpr const* s = builder.constant(stride);
            out.d[2] = builder.operation(DimensionOperation::kCEIL_DIV, *out.d[2], *s);
            out.d[3] = builder.operation(DimensionOperation::kCEIL_DIV, *out.d[3], *s);
        }
        return out;
    }

    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* inOut, int32_t nbInputs,
                                   int32_t nbOutputs) noexcept override {
        if (nbInputs != f_.inputs() || nbOutputs != f_.outputs() || pos < 0 || pos >= nbInputs + nbOutputs)
            return false;
        // INT8 kCHW32 everywhere: the kernels read and write 32-channel blocks directly; but the stem's input, the
        // network's, which it reads as it comes (kLINEAR)
        TensorFormat const want = f_.kernel_size == 7 && pos == 0 ? TensorFormat::kLINEAR : TensorFormat::kCHW32;
        return inOut[pos].type == DataType::kINT8 && inOut[pos].format == want;
    }

    void configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out,
                         int32_t nbOutputs) noexcept override {
        if (nbInputs != f_.inputs() || nbOutputs != f_.outputs()) {
            std::string const outs =
                f_.has_next ? " and two outputs [out, next_out] (next_* fields)" : " and one output";
            return refuse(f_.has_proj           ? "expects inputs [x, xp]" + outs + " (a projection + tail layer)"
                          : f_.residual()       ? "expects inputs [x, r]" + outs + " (r_scale > 0)"
                          : f_.kernel_size == 7 ? "expects input [x]" + outs + " (the stem)"
                                                : "expects input [x]" + outs + " (r_scale = 0: no residual input)");
        }
        Dims const& x = in[0].desc.dims;
        if (x.nbDims != 4) return refuse("x must be 4-D NCHW");
        if (x.d[1] != -1 && x.d[1] != f_.cin) refuse("x has " + std::to_string(x.d[1]) + " channels, cin = " +
                                                     std::to_string(f_.cin));
        if (f_.kernel_size == 7 && x.d[3] != -1 && x.d[3] % 16 != 0)
            refuse("the stem's input width " + std::to_string(x.d[3]) + " is not a multiple of 16 (its TMA rows)");
        if (f_.has_proj) {
            Dims const& xp = in[1].desc.dims;
            if (xp.nbDims != 4) return refuse("xp must be 4-D NCHW");
            if (xp.d[1] != -1 && xp.d[1] != f_.proj.cin)
                refuse("xp has " + std::to_string(xp.d[1]) + " channels, proj_cin = " + std::to_string(f_.proj.cin));
            // x (the tail's input) is on the output's grid: xp's N, its H and W divided by proj_stride (rounded up)
            if (!strided_shape(xp, x, f_.proj.stride))
                refuse("x must be [N, cin, ceil(H/proj_stride), ceil(W/proj_stride)] for xp [N, proj_cin, H, W]");
            workspace_ = workspace_for(in[1].max);   // what TensorRT allocates for this profile (getWorkspaceSize)
            return;
        }
        if (!f_.residual()) return;
        Dims const& r = in[1].desc.dims;
        if (r.nbDims != 4) return refuse("r must be 4-D NCHW");
        if (r.d[1] != -1 && r.d[1] != f_.cout) refuse("r has " + std::to_string(r.d[1]) + " channels, cout = " +
                                                      std::to_string(f_.cout));
        // r is the output's size: x's N, and its H and W divided by the stride (rounded up)
        if (!strided_shape(x, r, f_.stride)) refuse("r must be [N, cout, ceil(H/stride), ceil(W/stride)]");
    }

    size_t getWorkspaceSize(PluginTensorDesc const* inputs, int32_t nbInputs, PluginTensorDesc const*,
                            int32_t) const noexcept override {
        // the largest dims (TensorRT's contract): the projection's output where the fused kernel does not run there
        return workspace_ = f_.has_proj && nbInputs == 2 ? workspace_for(inputs[1].dims) : 0;
    }

    int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
                    void const* const* inputs, void* const* outputs, void* workspace,
                    cudaStream_t stream) noexcept override {
        if (!handle_) {
            if (int st = initialize()) return st;
        }
        Dims const& d = inputDesc[0].dims;
        if (d.nbDims != 4 || d.d[1] != f_.cin ||
            (f_.inputs() == 2 && inputDesc[1].dims.d[1] != (f_.has_proj ? f_.proj.cin : f_.cout))) {
            refuse("enqueue: unexpected input shapes");
            return -1;
        }
        int st;
        if (f_.has_next && f_.kernel_size == 7) {
            // the stem: n, h, w of its input x (as trtfuse_stem_forward's), no second input, no workspace; config -1:
            // the first stem configuration, which chains the next conv where it can
            st = trtfuse_next_forward(handle_, inputs[0], nullptr, outputs[0], outputs[1], static_cast<int>(d.d[0]),
                                      static_cast<int>(d.d[2]), static_cast<int>(d.d[3]), nullptr, -1, stream);
        } else if (f_.has_next) {
            // n, h, w as the layer's own forward gets them: xp's for a projection + tail layer, x's for a tail; the
            // workspace as the projection + tail forward's (enough for the next conv too), none for a tail
            Dims const& g = f_.has_proj ? inputDesc[1].dims : d;
            void* ws = f_.has_proj && workspace_ > 0 ? workspace : nullptr;
            st = trtfuse_next_forward(handle_, inputs[0], inputs[1], outputs[0], outputs[1], static_cast<int>(g.d[0]),
                                      static_cast<int>(g.d[2]), static_cast<int>(g.d[3]), ws, -1, stream);
        } else if (f_.has_proj) {
            Dims const& xp = inputDesc[1].dims;
            // TensorRT's workspace only where this plugin asked for one (the projection's output at the largest
            // dims, which holds it at any smaller batch; else the pointer may back nothing); without one the library
            // runs the fused kernel where it can
            void* ws = workspace_ > 0 ? workspace : nullptr;
            st = trtfuse_proj_tail_forward(handle_, inputs[0], inputs[1], outputs[0], static_cast<int>(xp.d[0]),
                                           static_cast<int>(xp.d[2]), static_cast<int>(xp.d[3]), ws, -1, stream);
        } else if (f_.kernel_size == 3) {
            st = trtfuse_conv3x3_forward(handle_, inputs[0], outputs[0], d.d[0], d.d[2], d.d[3], -1, stream);
        } else if (f_.kernel_size == 7) {
            st = trtfuse_stem_forward(handle_, inputs[0], outputs[0], d.d[0], d.d[2], d.d[3], -1, stream);
        } else {
            st = trtfuse_residual_conv_forward(handle_, inputs[0], f_.residual() ? inputs[1] : nullptr, outputs[0],
                                               d.d[0], d.d[2], d.d[3], -1, stream);
        }
        if (st != 0) refuse(std::string("enqueue: ") + trtfuse_residual_conv_error_string(st));
        return st;
    }

private:
    // The implicit-batch overloads of IPluginV2/IPluginV2Ext stay hidden on purpose.
    using IPluginV2::enqueue;
    using IPluginV2::getOutputDimensions;
    using IPluginV2::getWorkspaceSize;
    using IPluginV2Ext::configurePlugin;

    // The device layer (weights uploaded); const because getWorkspaceSize may need it before initialize().
    int create() const noexcept {
        if (handle_) return 0;
        int st;
        if (f_.kernel_size == 7)
            st = trtfuse_stem_create(f_.cin, f_.cout, f_.weights.data(), f_.w_scale.data(), f_.bias.data(), f_.x_scale,
                                     f_.out_scale, f_.relu, &handle_);
        else if (f_.kernel_size == 3)
            st = trtfuse_conv3x3_create(f_.cin, f_.cout, f_.weights.data(), f_.w_scale.data(), f_.bias.data(),
                                        f_.x_scale, f_.out_scale, f_.relu, f_.stride, &handle_);
        else if (f_.has_proj)
            st = trtfuse_proj_tail_create(f_.cin, f_.cout, f_.weights.data(), f_.w_scale.data(), f_.bias.data(),
                                          f_.x_scale, f_.r_scale, f_.out_scale, f_.relu, f_.proj.cin,
                                          f_.proj.weights.data(), f_.proj.w_scale.data(), f_.proj.bias.data(),
                                          f_.proj.x_scale, f_.proj.out_scale, f_.proj.stride, &handle_);
        else
            st = trtfuse_conv1x1_create(f_.cin, f_.cout, f_.weights.data(), f_.w_scale.data(), f_.bias.data(),
                                        f_.x_scale, f_.r_scale, f_.out_scale, f_.relu, f_.stride, &handle_);
        if (st != 0) {
            refuse(std::string("initialize: ") + trtfuse_residual_conv_error_string(st));
            return st;
        }
        return attach_next();
    }

    // Chains the next conv (next_* fields) onto the layer just made; on failure frees it, so initialize fails whole.
    int attach_next() const noexcept {
        if (!f_.has_next) return 0;
        int const st = trtfuse_next_attach(handle_, f_.next.cout, f_.next.weights.data(), f_.next.w_scale.data(),
                                           f_.next.bias.data(), f_.next.x_scale, f_.next.out_scale, f_.next.relu);
        if (st != 0) {
            refuse(std::string("initialize (next_* fields): ") + trtfuse_residual_conv_error_string(st));
            trtfuse_residual_conv_destroy(handle_);
            handle_ = nullptr;
        }
        return st;
    }

    // Workspace bytes for a block input xp of these dims (fused form; 0 where the fused kernel runs, for unknown dims
    // or on error).
    size_t workspace_for(Dims const& xp) const noexcept {
        if (!f_.has_proj || xp.nbDims != 4 || xp.d[0] <= 0 || xp.d[2] <= 0 || xp.d[3] <= 0 || create() != 0) return 0;
        int64_t const bytes = trtfuse_proj_tail_workspace_size(handle_, static_cast<int>(xp.d[0]),
                                                               static_cast<int>(xp.d[2]), static_cast<int>(xp.d[3]));
        return bytes > 0 ? static_cast<size_t>(bytes) : 0;
    }

    Fields f_;
    std::string ns_;
    mutable void* handle_ = nullptr;
    mutable size_t workspace_ = 0;   // the workspace TensorRT gives enqueue (the last getWorkspaceSize/profile)
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
            PluginField("kernel_size", nullptr, PluginFieldType::kINT32, 1),   // 1 (default), 3 or 7 (the stem)
            // the fused form (a stage's first block): all or none of these (proj_stride optional)
            PluginField("proj_weights", nullptr, PluginFieldType::kINT8, 0),
            PluginField("proj_w_scale", nullptr, PluginFieldType::kFLOAT32, 0),
            PluginField("proj_bias", nullptr, PluginFieldType::kFLOAT32, 0),
            PluginField("proj_x_scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("proj_out_scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("proj_cin", nullptr, PluginFieldType::kINT32, 1),
            PluginField("proj_stride", nullptr, PluginFieldType::kINT32, 1),
            // a tail or the stem that computes the next conv1 too (a second output): all or none of these
            PluginField("next_weights", nullptr, PluginFieldType::kINT8, 0),
            PluginField("next_w_scale", nullptr, PluginFieldType::kFLOAT32, 0),
            PluginField("next_bias", nullptr, PluginFieldType::kFLOAT32, 0),
            PluginField("next_x_scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("next_out_scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("next_cout", nullptr, PluginFieldType::kINT32, 1),
            PluginField("next_relu", nullptr, PluginFieldType::kINT32, 1),
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
            std::map<std::string, std::vector<int8_t>*> const weights = {
                {"weights", &f.weights}, {"proj_weights", &f.proj.weights}, {"next_weights", &f.next.weights}};
            std::map<std::string, std::vector<float>*> const arrays = {
                {"w_scale", &f.w_scale},           {"bias", &f.bias},
                {"proj_w_scale", &f.proj.w_scale}, {"proj_bias", &f.proj.bias},
                {"next_w_scale", &f.next.w_scale}, {"next_bias", &f.next.bias}};
            std::map<std::string, float*> const scalars = {
                {"x_scale", &f.x_scale},           {"r_scale", &f.r_scale},
                {"out_scale", &f.out_scale},       {"proj_x_scale", &f.proj.x_scale},
                {"proj_out_scale", &f.proj.out_scale}, {"next_x_scale", &f.next.x_scale},
                {"next_out_scale", &f.next.out_scale}};
            std::map<std::string, int*> const ints = {{"relu", &f.relu},         {"cin", &f.cin},
                                                      {"cout", &f.cout},         {"stride", &f.stride},
                                                      {"kernel_size", &f.kernel_size},
                                                      {"proj_cin", &f.proj.cin}, {"proj_stride", &f.proj.stride},
                                                      {"next_cout", &f.next.cout}, {"next_relu", &f.next.relu}};
            std::set<std::string> seen;
            for (int i = 0; fc && i < fc->nbFields; ++i) {
                PluginField const& p = fc->fields[i];
                std::string const n = p.name ? p.name : "";
                if (weights.count(n)) {
                    if (!read_weights(p, weights.at(n))) return nullptr;
                } else if (arrays.count(n)) {
                    if (!read_floats(p, arrays.at(n))) return nullptr;
                } else if (scalars.count(n)) {
                    std::vector<float> v;
                    if (!read_floats(p, &v) || v.size() != 1) return refuse(n + " must be one float"), nullptr;
                    *scalars.at(n) = v[0];
                } else if (ints.count(n)) {
                    if (p.type != PluginFieldType::kINT32 || p.length != 1 || !p.data)
                        return refuse(n + " must be one INT32"), nullptr;
                    *ints.at(n) = *static_cast<int32_t const*>(p.data);
                } else {
                    continue;   // other fields (plugin_version, plugin_namespace, ...) are not ours: ignored
                }
                seen.insert(n);
            }
            for (std::string const& n : seen) {
                f.has_proj = f.has_proj || n.rfind("proj_", 0) == 0;
                f.has_next = f.has_next || n.rfind("next_", 0) == 0;
            }
            for (PluginField const& a : attrs_) {   // relu, stride, kernel_size and proj_stride are optional
                std::string const n = a.name;
                bool const proj = n.rfind("proj_", 0) == 0, next = n.rfind("next_", 0) == 0;
                bool const optional = n == "relu" || n == "stride" || n == "kernel_size" || n == "proj_stride";
                if (seen.count(n) || optional || (proj && !f.has_proj) || (next && !f.has_next))
                    continue;
                return refuse("missing field " + n + (proj   ? " (the proj_* fields come all together)"
                                                      : next ? " (the next_* fields come all together)"
                                                             : "")),
                       nullptr;
            }
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
    // weights, proj_weights, next_weights: INT8, or INT32 / FLOAT holding integers in [-127, 127] (ONNX attributes
    // arrive as those).
    static bool read_weights(PluginField const& p, std::vector<int8_t>* out) {
        std::string const n = p.name;
        if (!p.data || p.length <= 0) return refuse(n + " is empty"), false;
        out->resize(p.length);
        for (int32_t i = 0; i < p.length; ++i) {
            double v;
            if (p.type == PluginFieldType::kINT8) v = static_cast<int8_t const*>(p.data)[i];
            else if (p.type == PluginFieldType::kINT32) v = static_cast<int32_t const*>(p.data)[i];
            else if (p.type == PluginFieldType::kFLOAT32) v = static_cast<float const*>(p.data)[i];
            else return refuse(n + " must be INT8, INT32 or FLOAT"), false;
            if (!(v >= -127 && v <= 127) || v != static_cast<int>(v))
                return refuse(n + " must be integers in [-127, 127]"), false;
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
