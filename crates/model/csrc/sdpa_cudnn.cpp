// Fused causal (grouped-query) attention, forward and backward, through
// cuDNN's SDPA graphs built with the cudnn-frontend headers.
//
// A thin C ABI for src/model/sdpa_cudnn.rs: the Rust side owns every device
// buffer (inputs, outputs, softmax stats and workspace) and the CUDA stream;
// this file builds one cuDNN graph per shape, layout and direction, keeps it
// for the life of the process, and enqueues it on the caller's stream.
//
// libcudnn.so.9 is opened with dlopen on first use (the frontend is compiled
// with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING), so the binary links without
// cuDNN and needs it only where attention runs on a GPU. No C++ exception
// crosses the C boundary: every entry point catches and returns a message.

#include <dlfcn.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

// The frontend, built for dynamic loading, resolves every cuDNN symbol
// through this handle; the application opens the library and sets it.
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

extern "C" {

// Shapes and layouts of one attention call. Strides are in elements and
// follow the (B, H, L, D) order of the dims; the last stride must be 1.
struct TtSdpaDims {
    int64_t b;
    int64_t h;
    int64_t h_kv;
    int64_t l;
    int64_t d;
    // 0 = bf16, 1 = f16.
    int32_t dtype;
    // Forward only: 1 = also write the softmax stats (needed by backward).
    int32_t with_stats;
    // 1 = packed (THD) sequences: B sequences of at most L tokens each, laid
    // out end to end as (T, H, D) rows; the caller passes each sequence's
    // start (as element offsets of Q/O, K/V and the stats) and length. Q,
    // K, V, O, dO and the gradients are then (T, heads, D) contiguous and
    // the stats (T, H) f32; rows outside every sequence are not touched.
    int32_t ragged;
    float scale;
    int64_t q_stride[4];
    int64_t k_stride[4];
    int64_t v_stride[4];
    // Packed only: a bound on T, which sizes the backward's f32 workspace
    // by tokens instead of by B x L (0: unset).
    int64_t max_tokens;
};

// The packed layout's device vectors (int32), for dims->ragged: each
// sequence's start as element offsets into Q/O/dO/dQ (B + 1), K/V/dK/dV
// (B + 1) and the stats (B + 1), and its length (B).
struct TtSdpaRagged {
    const void *offsets_q;
    const void *offsets_kv;
    const void *offsets_stats;
    const void *seq_len;
};

}  // extern "C"

namespace {

// Tensor ids in the variant packs.
enum : int64_t {
    UID_Q = 1,
    UID_K,
    UID_V,
    UID_O,
    UID_STATS,
    UID_DO,
    UID_DQ,
    UID_DK,
    UID_DV,
    UID_OFF_Q,
    UID_OFF_KV,
    UID_OFF_STATS,
    UID_SEQ_LEN,
};

enum class Direction : int64_t { Forward = 0, Backward = 1 };

using Key = std::array<int64_t, 24>;

struct State {
    std::mutex mutex;
    bool opened = false;
    std::string open_error;
    size_t version = 0;
    std::map<int, cudnnHandle_t> handles;
    std::map<Key, std::shared_ptr<fe::graph::Graph>> graphs;
    // Graphs built so far and the seconds their builds took.
    int64_t builds = 0;
    double build_seconds = 0.0;
};

State &state() {
    static State s;
    return s;
}

void write_error(char *err, size_t err_len, const std::string &message) {
    if (err == nullptr || err_len == 0) {
        return;
    }
    std::snprintf(err, err_len, "%s", message.c_str());
}

std::string fe_error(const char *what, fe::error_t e) {
    return std::string(what) + ": " + e.get_message() + " (cudnn-frontend error code " +
           std::to_string(static_cast<int>(e.get_code())) + ", cuDNN " +
           fe::detail::get_backend_version_string() + ")";
}

std::string cudnn_error(const char *what, cudnnStatus_t status) {
    return std::string(what) + " failed: " + fe::detail::get_error_string(status) + " (status " +
           std::to_string(static_cast<int>(status)) + ")";
}

// Opens libcudnn.so.9 once; the mutex is held by the caller.
void open_cudnn(State &s) {
    if (s.opened) {
        if (!s.open_error.empty()) {
            throw std::runtime_error(s.open_error);
        }
        return;
    }
    s.opened = true;
    dlerror();
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        const char *why = dlerror();
        s.open_error = std::string("cannot load libcudnn.so.9 (") + (why ? why : "unknown error") +
                       "); put the folder that holds it (for a PyTorch install: "
                       "site-packages/nvidia/cudnn/lib) on LD_LIBRARY_PATH";
        throw std::runtime_error(s.open_error);
    }
    fe::cudnn_dlhandle = lib;
    s.version = fe::detail::get_backend_version();
    if (s.version < 90000) {
        s.open_error = "cuDNN " + fe::detail::get_backend_version_string() +
                       " is too old for fused attention: need 9.x (libcudnn.so.9)";
        throw std::runtime_error(s.open_error);
    }
}

cudnnHandle_t handle_for(State &s, int device) {
    auto it = s.handles.find(device);
    if (it != s.handles.end()) {
        return it->second;
    }
    cudnnHandle_t handle = nullptr;
    cudnnStatus_t status = fe::detail::create_handle(&handle);
    if (status != CUDNN_STATUS_SUCCESS) {
        throw std::runtime_error(cudnn_error("cudnnCreate", status));
    }
    s.handles.emplace(device, handle);
    return handle;
}

Key key_of(const TtSdpaDims &d, Direction direction, int device) {
    int32_t scale_bits = 0;
    std::memcpy(&scale_bits, &d.scale, sizeof scale_bits);
    return Key{static_cast<int64_t>(direction),
               device,
               d.b,
               d.h,
               d.h_kv,
               d.l,
               d.d,
               d.dtype,
               d.with_stats,
               d.ragged,
               scale_bits,
               d.q_stride[0],
               d.q_stride[1],
               d.q_stride[2],
               d.q_stride[3],
               d.k_stride[0],
               d.k_stride[1],
               d.k_stride[2],
               d.k_stride[3],
               d.v_stride[0],
               d.v_stride[1],
               d.v_stride[2],
               d.v_stride[3],
               d.max_tokens};
}

std::vector<int64_t> strides(const int64_t (&s)[4]) {
    return {s[0], s[1], s[2], s[3]};
}

void check_dims(const TtSdpaDims &d) {
    if (d.b <= 0 || d.h <= 0 || d.h_kv <= 0 || d.l <= 0 || d.d <= 0) {
        throw std::runtime_error("fused attention: every dimension must be positive");
    }
    if (d.h % d.h_kv != 0) {
        throw std::runtime_error("fused attention: the number of query heads must be a multiple of the "
                                 "number of key/value heads");
    }
    if (d.dtype != 0 && d.dtype != 1) {
        throw std::runtime_error("fused attention: dtype must be bf16 or f16");
    }
    if (d.q_stride[3] != 1 || d.k_stride[3] != 1 || d.v_stride[3] != 1) {
        throw std::runtime_error("fused attention: the head dimension must be contiguous (stride 1)");
    }
}

// Contiguous (B, H, L, D) strides: the layout of O, dO, dQ, dK and dV.
std::vector<int64_t> packed(int64_t h, int64_t l, int64_t d) {
    return {h * l * d, l * d, d, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g,
                                                    const char *name,
                                                    int64_t uid,
                                                    std::vector<int64_t> dim,
                                                    std::vector<int64_t> stride) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

std::shared_ptr<fe::graph::Graph> new_graph(const TtSdpaDims &d) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(d.dtype == 0 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

// An int32 (B + 1) or (B) vector of the packed layout.
std::shared_ptr<fe::graph::Tensor_attributes> index_vector(fe::graph::Graph &g, const char *name, int64_t uid,
                                                           int64_t n) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT32));
}

// Strides of a packed (T, heads, D) tensor seen as (B, heads, L, D).
std::vector<int64_t> thd(int64_t heads, int64_t l, int64_t d) {
    return {l * heads * d, d, heads * d, 1};
}

// The (unbuilt) attention graph for `d` in one direction.
std::shared_ptr<fe::graph::Graph> describe(const TtSdpaDims &d, Direction direction) {
    auto g = new_graph(d);
    const bool ragged = d.ragged != 0;
    std::vector<int64_t> q_dim{d.b, d.h, d.l, d.d};
    std::vector<int64_t> kv_dim{d.b, d.h_kv, d.l, d.d};
    std::vector<int64_t> stats_dim{d.b, d.h, d.l, 1};
    std::vector<int64_t> stats_stride =
        ragged ? std::vector<int64_t>{d.l * d.h, 1, d.h, 1} : std::vector<int64_t>{d.h * d.l, d.l, 1, 1};
    // Where O, dO and the gradients live: contiguous (B, H, L, D), or packed.
    auto out_q = ragged ? thd(d.h, d.l, d.d) : packed(d.h, d.l, d.d);
    auto out_kv = ragged ? thd(d.h_kv, d.l, d.d) : packed(d.h_kv, d.l, d.d);
    auto q = input(*g, "Q", UID_Q, q_dim, strides(d.q_stride));
    auto k = input(*g, "K", UID_K, kv_dim, strides(d.k_stride));
    auto v = input(*g, "V", UID_V, kv_dim, strides(d.v_stride));
    std::shared_ptr<fe::graph::Tensor_attributes> off_q, off_kv, off_stats, seq_len;
    if (ragged) {
        off_q = index_vector(*g, "offsets_q", UID_OFF_Q, d.b + 1);
        off_kv = index_vector(*g, "offsets_kv", UID_OFF_KV, d.b + 1);
        off_stats = index_vector(*g, "offsets_stats", UID_OFF_STATS, d.b + 1);
        seq_len = index_vector(*g, "seq_len", UID_SEQ_LEN, d.b);
        q->set_ragged_offset(off_q);
        k->set_ragged_offset(off_kv);
        v->set_ragged_offset(off_kv);
    }

    if (direction == Direction::Forward) {
        auto options = fe::graph::SDPA_attributes()
                           .set_name("causal_sdpa_fwd")
                           .set_generate_stats(d.with_stats != 0)
                           .set_attn_scale(d.scale)
                           .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                           .set_diagonal_band_right_bound(0);
        if (ragged) {
            options.set_padding_mask(true).set_seq_len_q(seq_len).set_seq_len_kv(seq_len);
        }
        auto [o, stats] = g->sdpa(q, k, v, options);
        o->set_output(true).set_uid(UID_O).set_dim(q_dim).set_stride(out_q);
        if (ragged) {
            o->set_ragged_offset(off_q);
        }
        if (d.with_stats != 0) {
            if (!stats) {
                throw std::runtime_error("fused attention: the forward graph has no stats output");
            }
            stats->set_output(true)
                .set_uid(UID_STATS)
                .set_data_type(fe::DataType_t::FLOAT)
                .set_dim(stats_dim)
                .set_stride(stats_stride);
            if (ragged) {
                stats->set_ragged_offset(off_stats);
            }
        }
    } else {
        auto o = input(*g, "O", UID_O, q_dim, out_q);
        auto d_o = input(*g, "dO", UID_DO, q_dim, out_q);
        auto stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("Stats")
                                   .set_uid(UID_STATS)
                                   .set_dim(stats_dim)
                                   .set_stride(stats_stride)
                                   .set_data_type(fe::DataType_t::FLOAT));
        if (ragged) {
            o->set_ragged_offset(off_q);
            d_o->set_ragged_offset(off_q);
            stats->set_ragged_offset(off_stats);
        }
        auto options = fe::graph::SDPA_backward_attributes()
                           .set_name("causal_sdpa_bwd")
                           // Without it dQ is summed with atomics in an order
                           // that changes run to run; training must repeat
                           // exactly (bit-for-bit resume).
                           .set_deterministic_algorithm(true)
                           .set_attn_scale(d.scale)
                           .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                           .set_diagonal_band_right_bound(0);
        if (ragged) {
            options.set_padding_mask(true).set_seq_len_q(seq_len).set_seq_len_kv(seq_len);
            if (d.max_tokens > 0) {
                options.set_max_total_seq_len_q(d.max_tokens).set_max_total_seq_len_kv(d.max_tokens);
            }
        }
        auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
        dq->set_output(true).set_uid(UID_DQ).set_dim(q_dim).set_stride(out_q);
        dk->set_output(true).set_uid(UID_DK).set_dim(kv_dim).set_stride(out_kv);
        dv->set_output(true).set_uid(UID_DV).set_dim(kv_dim).set_stride(out_kv);
        if (ragged) {
            dq->set_ragged_offset(off_q);
            dk->set_ragged_offset(off_kv);
            dv->set_ragged_offset(off_kv);
        }
    }

    return g;
}

// Builds the graph for `d` with the engines cuDNN's heuristics rank first
// (mode A); if none builds, retries with its fallback list.
std::shared_ptr<fe::graph::Graph> build(cudnnHandle_t handle, const TtSdpaDims &d, Direction direction) {
    const char *what = direction == Direction::Forward ? "building the cuDNN SDPA forward graph"
                                                       : "building the cuDNN SDPA backward graph";
    auto g = describe(d, direction);
    auto e = g->build(handle, {fe::HeurMode_t::A});
    if (e.is_good()) {
        return g;
    }
    auto fallback = describe(d, direction);
    auto e2 = fallback->build(handle, {fe::HeurMode_t::FALLBACK});
    if (e2.is_good()) {
        return fallback;
    }
    throw std::runtime_error(fe_error(what, e) + "; with the fallback engines: " + e2.get_message());
}

// The cached graph for `d`, built on first use; the mutex is held by the caller.
std::shared_ptr<fe::graph::Graph> graph_for(State &s, const TtSdpaDims &d, Direction direction, int device,
                                            cudnnHandle_t handle) {
    Key key = key_of(d, direction, device);
    auto it = s.graphs.find(key);
    if (it != s.graphs.end()) {
        return it->second;
    }
    auto started = std::chrono::steady_clock::now();
    auto g = build(handle, d, direction);
    s.graphs.emplace(key, g);
    s.builds += 1;
    s.build_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return g;
}

// The packed layout's vectors in a variant pack.
void add_ragged(const TtSdpaDims &d, const TtSdpaRagged *r, std::unordered_map<int64_t, void *> &pack) {
    if (d.ragged == 0) {
        return;
    }
    if (r == nullptr || !r->offsets_q || !r->offsets_kv || !r->offsets_stats || !r->seq_len) {
        throw std::runtime_error("fused attention: packed sequences without their offsets and lengths");
    }
    pack[UID_OFF_Q] = const_cast<void *>(r->offsets_q);
    pack[UID_OFF_KV] = const_cast<void *>(r->offsets_kv);
    pack[UID_OFF_STATS] = const_cast<void *>(r->offsets_stats);
    pack[UID_SEQ_LEN] = const_cast<void *>(r->seq_len);
}

template <typename F>
int guarded(char *err, size_t err_len, F &&body) {
    try {
        body();
        return 0;
    } catch (const std::exception &e) {
        write_error(err, err_len, e.what());
    } catch (...) {
        write_error(err, err_len, "fused attention: unknown C++ exception");
    }
    return 1;
}

int64_t workspace_size(const TtSdpaDims *dims, Direction direction, int device) {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    open_cudnn(s);
    check_dims(*dims);
    cudnnHandle_t handle = handle_for(s, device);
    auto g = graph_for(s, *dims, direction, device, handle);
    int64_t size = 0;
    auto e = g->get_workspace_size(size);
    if (e.is_bad()) {
        throw std::runtime_error(fe_error("querying the cuDNN SDPA workspace size", e));
    }
    return size;
}

void execute(const TtSdpaDims *dims, Direction direction, int device, void *stream,
             std::unordered_map<int64_t, void *> &pack, void *workspace) {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    open_cudnn(s);
    check_dims(*dims);
    cudnnHandle_t handle = handle_for(s, device);
    auto g = graph_for(s, *dims, direction, device, handle);
    cudnnStatus_t status = fe::detail::set_stream(handle, static_cast<cudaStream_t>(stream));
    if (status != CUDNN_STATUS_SUCCESS) {
        throw std::runtime_error(cudnn_error("cudnnSetStream", status));
    }
    auto e = g->execute(handle, pack, workspace);
    if (e.is_bad()) {
        throw std::runtime_error(fe_error(
            direction == Direction::Forward ? "running the cuDNN SDPA forward" : "running the cuDNN SDPA backward",
            e));
    }
}

}  // namespace

extern "C" {

// The loaded cuDNN's version (e.g. 91900 for 9.19.0), loading it if needed.
int tt_sdpa_cudnn_version(int64_t *version, char *err, size_t err_len) {
    return guarded(err, err_len, [&] {
        State &s = state();
        std::lock_guard<std::mutex> lock(s.mutex);
        open_cudnn(s);
        *version = static_cast<int64_t>(s.version);
    });
}

// Graphs built so far (one a shape and direction) and the seconds spent
// building them.
void tt_sdpa_graph_builds(int64_t *count, double *seconds) {
    State &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    *count = s.builds;
    *seconds = s.build_seconds;
}

// Bytes of device workspace the forward needs; builds and caches its graph.
int tt_sdpa_fwd_workspace(const TtSdpaDims *dims, int device, int64_t *size, char *err, size_t err_len) {
    return guarded(err, err_len, [&] { *size = workspace_size(dims, Direction::Forward, device); });
}

// Enqueues the forward on `stream`: o (B, H, L, D) contiguous; stats
// (B, H, L, 1) f32 contiguous, written only when dims->with_stats is set.
int tt_sdpa_fwd(const TtSdpaDims *dims, int device, void *stream, const void *q, const void *k, const void *v,
                void *o, void *stats, const TtSdpaRagged *ragged, void *workspace, char *err, size_t err_len) {
    return guarded(err, err_len, [&] {
        std::unordered_map<int64_t, void *> pack{
            {UID_Q, const_cast<void *>(q)}, {UID_K, const_cast<void *>(k)}, {UID_V, const_cast<void *>(v)},
            {UID_O, o}};
        if (dims->with_stats != 0) {
            pack[UID_STATS] = stats;
        }
        add_ragged(*dims, ragged, pack);
        execute(dims, Direction::Forward, device, stream, pack, workspace);
    });
}

// Bytes of device workspace the backward needs; builds and caches its graph.
int tt_sdpa_bwd_workspace(const TtSdpaDims *dims, int device, int64_t *size, char *err, size_t err_len) {
    return guarded(err, err_len, [&] { *size = workspace_size(dims, Direction::Backward, device); });
}

// Enqueues the backward on `stream`. o, d_o, dq (B, H, L, D) and dk, dv
// (B, H_kv, L, D) are contiguous; stats is the forward's.
int tt_sdpa_bwd(const TtSdpaDims *dims, int device, void *stream, const void *q, const void *k, const void *v,
                const void *o, const void *d_o, const void *stats, void *dq, void *dk, void *dv,
                const TtSdpaRagged *ragged, void *workspace, char *err, size_t err_len) {
    return guarded(err, err_len, [&] {
        std::unordered_map<int64_t, void *> pack{
            {UID_Q, const_cast<void *>(q)},         {UID_K, const_cast<void *>(k)},
            {UID_V, const_cast<void *>(v)},         {UID_O, const_cast<void *>(o)},
            {UID_DO, const_cast<void *>(d_o)},      {UID_STATS, const_cast<void *>(stats)},
            {UID_DQ, dq},                           {UID_DK, dk},
            {UID_DV, dv}};
        add_ragged(*dims, ragged, pack);
        execute(dims, Direction::Backward, device, stream, pack, workspace);
    });
}

}  // extern "C"
