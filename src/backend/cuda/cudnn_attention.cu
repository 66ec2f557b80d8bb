/*
 * cudnn_attention — attention through cuDNN's SDPA graphs (cudnn_attention.h, issue 45).
 *
 * With cudnn-frontend's headers on the include path (make's -isystem build/cudnn-frontend-VERSION/include,
 * tools/deps.sh) this is the cuDNN path; without them, and always under tests/cudaemu (whose g++ build has no
 * cuDNN), the stub at the end answers "unavailable", so that the CUDA backend builds and runs its own kernels.
 */
#include "cudnn_attention.h"

#if defined(__has_include) && !defined(CUDAEMU_RUNTIME_H) /* tests/cudaemu: no cuDNN */
/* both: a CUDA toolkit without cuDNN's own headers (a GPU machine's fallback build) builds the stub too */
#if __has_include(<cudnn_frontend.h>) && __has_include(<cudnn.h>)
#define SHARDLM_CUDNN 1
#endif
#endif

#if defined(__CUDA_ARCH__)
/* nvcc's device passes (one per architecture): nothing here runs on the GPU, so only the host pass parses the
 * frontend's headers, which is most of this file's compile time. */
#elif defined(SHARDLM_CUDNN)
/* The frontend is compiled to dlopen cuDNN (its NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING shim, every call through
 * cudnn_dlhandle, which this file sets), so the binary runs where there is no cuDNN; without its JSON
 * dependency (nlohmann), which only serialisation uses. */
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <dlfcn.h>

#include <cstring> /* before the frontend: 1.32's headers call memcpy and strlen without including it */
#include <map>
#include <memory>
#include <string>

/* cudnn-frontend 1.32's own header has one loop nvcc finds unreachable (#128-D); silenced for its headers
 * only, so that the same warning in this file's code still stops the -Werror build. */
#ifdef __NVCC_DIAG_PRAGMA_SUPPORT__
#pragma nv_diag_suppress 128
#endif
#include <cudnn_frontend.h>
#ifdef __NVCC_DIAG_PRAGMA_SUPPORT__
#pragma nv_diag_default 128
#endif

#include "cuda_internal.h"

extern "C" {
#include "backend/sdpa_layout.h"
}

namespace fe = cudnn_frontend;

/* The handle of the dlopened library, which the frontend's shim resolves every cuDNN call through. */
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

/* ---- the library ----------------------------------------------------------------------------------------- */

static long g_version = -1; /* -1: not tried yet; 0: none */
static std::string g_missing;
static cudnnHandle_t g_handle;
static long g_calls;

/* cuDNN 9's libcudnn.so.9 dispatches to sub-libraries by soname; loading them first from the same folder (when
 * the folder is not on the loader's path, as the PyTorch wheel's is not) makes those lookups find them. */
static void *open_in(const std::string &dir)
{
    static const char *const subs[] = {"libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9",
                                       "libcudnn_engines_runtime_compiled.so.9", "libcudnn_heuristic.so.9"};
    for (const char *s : subs)
        dlopen((dir + "/" + s).c_str(), RTLD_NOW | RTLD_GLOBAL); /* optional: an older layout may lack one */
    return dlopen((dir + "/libcudnn.so.9").c_str(), RTLD_NOW | RTLD_GLOBAL);
}

/* The folder of path (a file) or path itself (a folder). */
static std::string folder_of(const char *path)
{
    std::string p(path);
    const size_t so = p.rfind(".so");
    if (so != std::string::npos && p.find('/', so) == std::string::npos) {
        const size_t slash = p.rfind('/');
        return slash == std::string::npos ? std::string(".") : p.substr(0, slash);
    }
    return p;
}

static void load_library(void)
{
    void *h = nullptr;
    std::string tried;
    const char *env = getenv("SHARDLM_CUDNN_LIB");
    if (env && *env) {
        h = open_in(folder_of(env));
        tried = std::string("SHARDLM_CUDNN_LIB=") + env;
    } else {
        h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
        tried = "libcudnn.so.9 on the loader's path";
        if (!h) {
            const char *home = getenv("CUDA_HOME");
            const std::string dir = std::string(home && *home ? home : "/usr/local/cuda") + "/lib64";
            h = open_in(dir);
            tried += ", " + dir;
        }
    }
    if (!h) {
        const char *e = dlerror();
        g_missing = "libcudnn.so.9 not found (tried " + tried + (e ? std::string("; ") + e : std::string()) +
                    "); set SHARDLM_CUDNN_LIB to its folder";
        g_version = 0;
        return;
    }
    fe::cudnn_dlhandle = h;
    try {
        g_version = (long)fe::detail::get_backend_version();
        if (fe::detail::create_handle(&g_handle) != CUDNN_STATUS_SUCCESS) {
            g_missing = "cudnnCreate failed (no usable GPU for cuDNN?)";
            g_version = 0;
        }
    } catch (const std::exception &e) {
        g_missing = std::string("cuDNN did not load: ") + e.what();
        g_version = 0;
    }
}

extern "C" long cudnn_attention_headers(void) { return CUDNN_VERSION; }

extern "C" long cudnn_attention_library(const char **why)
{
    if (g_version < 0)
        load_library();
    if (why)
        *why = g_version ? nullptr : g_missing.c_str();
    return g_version;
}

extern "C" long backend_cuda_attention_cudnn_calls(void) { return g_calls; }

/* ---- graphs ---------------------------------------------------------------------------------------------- */

/* The tensors' uids in the graphs and their variant packs. */
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
    UID_SEQ_Q, UID_SEQ_KV,
    UID_OFF_Q, UID_OFF_K, UID_OFF_V, UID_OFF_O, UID_OFF_STATS, UID_OFF_DO, UID_OFF_DQ, UID_OFF_DK, UID_OFF_DV,
};

struct graph_entry {
    std::shared_ptr<fe::graph::Graph> graph; /* null: cuDNN refused the shape (refusal says why) */
    std::string refusal;
    int64_t workspace;
};

/* Graphs by shape, dtype and direction, built at the first call of each and kept for the process: never
 * destroyed, because static destructors run after the CUDA runtime's exit handlers may have torn the context
 * down, and a plan's destructor then calls into cuDNN (cudnn-frontend leaks its own statics for the same reason). */
static std::map<std::string, graph_entry> &g_graphs = *new std::map<std::string, graph_entry>;

static std::shared_ptr<fe::graph::Tensor_attributes> tensor_of(fe::graph::Graph &g, const char *name, int64_t uid,
                                                               const struct sdpa_tensor &x)
{
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({x.dim[0], x.dim[1], x.dim[2], x.dim[3]})
                        .set_stride({x.stride[0], x.stride[1], x.stride[2], x.stride[3]}));
}

/* A (batch, 1, 1, 1) int32 tensor: sequence lengths, or (with n = batch + 1) a ragged offset array. */
static std::shared_ptr<fe::graph::Tensor_attributes> ints_of(fe::graph::Graph &g, const char *name, int64_t uid,
                                                             int64_t n)
{
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT32));
}

static void set_out(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, const struct sdpa_tensor &x)
{
    t->set_output(true).set_uid(uid).set_dim({x.dim[0], x.dim[1], x.dim[2], x.dim[3]}).set_stride(
        {x.stride[0], x.stride[1], x.stride[2], x.stride[3]});
}

static std::shared_ptr<fe::graph::Graph> new_graph(enum dtype act)
{
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(act == DTYPE_BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

/* Whether a frontend call succeeded; its message into why if not. */
static bool good(fe::error_t r, std::string &why)
{
    if (r.is_good())
        return true;
    why = r.get_message();
    return false;
}

/* The graph of one direction (backward 0/1) for layout L, from the cache or built now. */
static graph_entry &graph_for(int backward, const struct sdpa_layout &L, int B, int T, int NH, int NKV, int hs,
                              int window, enum dtype act)
{
    char key[200];
    snprintf(key, sizeof key, "%s %s B%d T%d NH%d NKV%d hs%d batch%lld ragged%d window%d scale%a",
             backward ? "bwd" : "fwd", dtype_name(act), B, T, NH, NKV, hs, (long long)L.batch, L.ragged, window,
             (double)L.scale);
    auto it = g_graphs.find(key);
    if (it != g_graphs.end())
        return it->second;
    graph_entry e{nullptr, std::string(), 0};
    try {
        auto g = new_graph(act);
        const int64_t n = L.batch;
        auto Q = tensor_of(*g, "Q", UID_Q, L.q), K = tensor_of(*g, "K", UID_K, L.k), V = tensor_of(*g, "V", UID_V, L.v);
        std::shared_ptr<fe::graph::Tensor_attributes> seq_q, seq_kv;
        if (L.ragged) {
            Q->set_ragged_offset(ints_of(*g, "Q_off", UID_OFF_Q, n + 1));
            K->set_ragged_offset(ints_of(*g, "K_off", UID_OFF_K, n + 1));
            V->set_ragged_offset(ints_of(*g, "V_off", UID_OFF_V, n + 1));
            seq_q = ints_of(*g, "seq_q", UID_SEQ_Q, n);
            seq_kv = ints_of(*g, "seq_kv", UID_SEQ_KV, n);
        }
        const int64_t tokens = (int64_t)B * T;
        if (!backward) {
            auto opt = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(
                L.scale);
            opt.set_causal_mask(true);
            if (window > 0) /* top-left causal band: keys kv > q - W are kept (transformers' sliding window) */
                opt.set_diagonal_band_left_bound(window);
            if (L.ragged)
                opt.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv).set_max_total_seq_len_q(
                    tokens).set_max_total_seq_len_kv(tokens);
            auto [O, Stats] = g->sdpa(Q, K, V, opt);
            set_out(O, UID_O, L.o);
            set_out(Stats, UID_STATS, L.stats);
            Stats->set_data_type(fe::DataType_t::FLOAT);
            if (L.ragged) {
                O->set_ragged_offset(ints_of(*g, "O_off", UID_OFF_O, n + 1));
                Stats->set_ragged_offset(ints_of(*g, "Stats_off", UID_OFF_STATS, n + 1));
            }
        } else {
            auto O = tensor_of(*g, "O", UID_O, L.o), dO = tensor_of(*g, "dO", UID_DO, L.o);
            auto Stats = tensor_of(*g, "Stats", UID_STATS, L.stats);
            Stats->set_data_type(fe::DataType_t::FLOAT);
            auto opt = fe::graph::SDPA_backward_attributes()
                           .set_name("attention_backward")
                           .set_attn_scale(L.scale)
                           .set_deterministic_algorithm(true); /* bit-exact resume (DESIGN §5) */
            opt.set_causal_mask(true);
            if (window > 0)
                opt.set_diagonal_band_left_bound(window);
            if (L.ragged) {
                O->set_ragged_offset(ints_of(*g, "O_off", UID_OFF_O, n + 1));
                dO->set_ragged_offset(ints_of(*g, "dO_off", UID_OFF_DO, n + 1));
                Stats->set_ragged_offset(ints_of(*g, "Stats_off", UID_OFF_STATS, n + 1));
                opt.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv).set_max_total_seq_len_q(
                    tokens).set_max_total_seq_len_kv(tokens);
            }
            auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opt);
            set_out(dQ, UID_DQ, L.q);
            set_out(dK, UID_DK, L.k);
            set_out(dV, UID_DV, L.v);
            if (L.ragged) {
                dQ->set_ragged_offset(ints_of(*g, "dQ_off", UID_OFF_DQ, n + 1));
                dK->set_ragged_offset(ints_of(*g, "dK_off", UID_OFF_DK, n + 1));
                dV->set_ragged_offset(ints_of(*g, "dV_off", UID_OFF_DV, n + 1));
            }
        }
        if (good(g->validate(), e.refusal) && good(g->build_operation_graph(g_handle), e.refusal) &&
            good(g->create_execution_plans({fe::HeurMode_t::A}), e.refusal) &&
            good(g->check_support(g_handle), e.refusal) && good(g->build_plans(g_handle), e.refusal) &&
            good(g->get_workspace_size(e.workspace), e.refusal))
            e.graph = g;
    } catch (const std::exception &ex) {
        e.refusal = ex.what();
    }
    if (!e.graph)
        e.refusal = std::string("cuDNN refused the ") + (backward ? "backward" : "forward") + " graph for " + key +
                    ": " + (e.refusal.empty() ? "no reason given" : e.refusal);
    return g_graphs.emplace(key, e).first->second;
}

/* ---- per-call buffers ------------------------------------------------------------------------------------ */

/* The workspace of the largest graph run so far, the packed rows' arrays and their token-major statistics:
 * device memory that grows (at the first call of a larger shape, never in the steady state), outside the memory
 * plan, which does not reserve it yet. The backward's workspace holds fp32 copies of dQ and of the statistics
 * (cudnn-frontend's composite backward: about B T NH (hs + 1) floats, 64 MiB at Llama-3.1-8B's heads with
 * B 2, T 2048; packed rows: dQ's copy takes qkv's strides, half as much again); the GPU session's peaks will
 * say what to plan. */
static void *g_workspace;
static int64_t g_workspace_bytes;
static int32_t *g_ragged_dev, *g_ragged_host; /* seq_len, then the offsets of qkv, out, lse: 4 (n + 1) int32 */
static int32_t *g_pos_host;
static int64_t g_ragged_cap, g_pos_cap;
static float *g_stats; /* packed rows: the token-major statistics (B T, NH) */
static int64_t g_stats_cap;

static float *stats_buffer(int64_t n)
{
    if (n > g_stats_cap) {
        if (g_stats)
            cudaCheck(cudaFree(g_stats));
        cudaCheck(cudaMalloc((void **)&g_stats, (size_t)n * sizeof(float)));
        g_stats_cap = n;
    }
    return g_stats;
}

static void *workspace_of(int64_t bytes)
{
    if (bytes > g_workspace_bytes) {
        if (g_workspace)
            cudaCheck(cudaFree(g_workspace));
        cudaCheck(cudaMalloc(&g_workspace, (size_t)bytes));
        g_workspace_bytes = bytes;
    }
    return g_workspace;
}

/* The packed rows' lengths and offsets on the device (4 arrays of n + 1 int32 from the returned pointer), from
 * pos copied to the host (one synchronisation a packed call: the layout needs the samples on the host), or
 * NULL with why. */
static int32_t *ragged_upload(struct sdpa_layout *L, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                              char *why, size_t why_cap)
{
    const int64_t cap = sdpa_layout_max_batch(B, T) + 1, tokens = (int64_t)B * T;
    if (tokens > g_pos_cap) {
        if (g_pos_host)
            cudaCheck(cudaFreeHost(g_pos_host));
        cudaCheck(cudaMallocHost((void **)&g_pos_host, (size_t)tokens * sizeof(int32_t)));
        g_pos_cap = tokens;
    }
    if (cap > g_ragged_cap) {
        if (g_ragged_dev)
            cudaCheck(cudaFree(g_ragged_dev));
        if (g_ragged_host)
            cudaCheck(cudaFreeHost(g_ragged_host));
        cudaCheck(cudaMalloc((void **)&g_ragged_dev, (size_t)(4 * cap) * sizeof(int32_t)));
        cudaCheck(cudaMallocHost((void **)&g_ragged_host, (size_t)(4 * cap) * sizeof(int32_t)));
        g_ragged_cap = cap;
    }
    cudaCheck(cudaMemcpyAsync(g_pos_host, pos, (size_t)tokens * sizeof(int32_t), cudaMemcpyDeviceToHost, g_stream));
    stream_wait(); /* also: the previous call's upload from g_ragged_host is done */
    std::unique_ptr<int32_t[]> len(new int32_t[cap]);
    std::unique_ptr<int64_t[]> off(new int64_t[3 * cap]);
    struct sdpa_ragged r = {len.get(), off.get(), off.get() + cap, off.get() + 2 * cap};
    if (sdpa_layout_of(L, &r, B, T, NH, NKV, hs, g_pos_host, why, why_cap) != 0)
        return nullptr;
    const int64_t n = L->batch + 1;
    for (int64_t i = 0; i < n; i++) {
        g_ragged_host[i] = i < L->batch ? len[i] : 0;
        for (int a = 0; a < 3; a++) {
            const int64_t v = off[a * cap + i];
            if (v > INT32_MAX) {
                snprintf(why, why_cap, "packed rows: an offset of %lld elements is past cuDNN's int32 offsets",
                         (long long)v);
                return nullptr;
            }
            g_ragged_host[(1 + a) * n + i] = (int32_t)v;
        }
    }
    cudaCheck(cudaMemcpyAsync(g_ragged_dev, g_ragged_host, (size_t)(4 * n) * sizeof(int32_t), cudaMemcpyHostToDevice,
                              g_stream));
    return g_ragged_dev;
}

/* The layout of this call (and its packed arrays on the device in *ragged), and its graph, or NULL with why. */
static graph_entry *prepare(int backward, struct sdpa_layout *L, int32_t **ragged, const int32_t *pos, int B, int T,
                            int NH, int NKV, int hs, const struct attn_opts *opt, enum dtype act, cudaStream_t stream,
                            char *why, size_t why_cap)
{
    const char *missing;
    if (!cudnn_attention_library(&missing)) {
        snprintf(why, why_cap, "%s", missing);
        return nullptr;
    }
    if (opt && opt->softcap > 0.0f) { /* cudnn_attention.h: the soft-cap is the own kernels' */
        snprintf(why, why_cap, "soft-capped scores (attn_logit_softcapping) are not wired into cuDNN's graphs");
        return nullptr;
    }
    *ragged = nullptr;
    if (pos) {
        if (!(*ragged = ragged_upload(L, pos, B, T, NH, NKV, hs, why, why_cap)))
            return nullptr;
    } else if (sdpa_layout_of(L, nullptr, B, T, NH, NKV, hs, nullptr, why, why_cap) != 0)
        return nullptr;
    if (opt && opt->scale > 0.0f)
        L->scale = opt->scale;
    graph_entry &e = graph_for(backward, *L, B, T, NH, NKV, hs, opt ? opt->window : 0, act);
    if (!e.graph) {
        snprintf(why, why_cap, "%s", e.refusal.c_str());
        return nullptr;
    }
    if (fe::detail::set_stream(g_handle, stream) != CUDNN_STATUS_SUCCESS) {
        snprintf(why, why_cap, "cudnnSetStream failed");
        return nullptr;
    }
    return &e;
}

/* The packed arrays' entries of the variant pack: lengths at 0, offsets of qkv, out and lse after. */
static void pack_ragged(std::unordered_map<int64_t, void *> &pack, int32_t *ragged, int64_t batch, int backward)
{
    const int64_t n = batch + 1;
    int32_t *qkv = ragged + n, *o = ragged + 2 * n, *stats = ragged + 3 * n;
    pack[UID_SEQ_Q] = pack[UID_SEQ_KV] = ragged;
    pack[UID_OFF_Q] = pack[UID_OFF_K] = pack[UID_OFF_V] = qkv;
    pack[UID_OFF_O] = o;
    pack[UID_OFF_STATS] = stats;
    if (backward) {
        pack[UID_OFF_DO] = o;
        pack[UID_OFF_DQ] = pack[UID_OFF_DK] = pack[UID_OFF_DV] = qkv;
    }
}

static int run(graph_entry &e, std::unordered_map<int64_t, void *> &pack, char *why, size_t why_cap)
{
    try {
        std::string failure;
        if (!good(e.graph->execute(g_handle, pack, workspace_of(e.workspace)), failure)) {
            snprintf(why, why_cap, "cuDNN's attention failed to run: %s", failure.c_str());
            return 0;
        }
    } catch (const std::exception &ex) {
        snprintf(why, why_cap, "cuDNN's attention failed to run: %s", ex.what());
        return 0;
    }
    g_calls++;
    return 1;
}

/* An element pointer offset by off elements of dtype act. */
static void *at(const void *p, int64_t off) { return (char *)p + off * 2; /* fp16 and bf16: 2 bytes */ }

/* One call's tensors: the forward's (out and lse written; dout, dqkv NULL) or the backward's (dqkv written). */
struct sdpa_tensors {
    const void *qkv, *out, *dout;
    const float *lse;
    void *dqkv;
};

static int attend(int backward, const struct sdpa_tensors &x, const int32_t *pos, int B, int T, int NH, int NKV,
                  int hs, const struct attn_opts *opt, enum dtype act, cudaStream_t stream, char *why, size_t why_cap)
{
    struct sdpa_layout L;
    int32_t *ragged;
    graph_entry *e = prepare(backward, &L, &ragged, pos, B, T, NH, NKV, hs, opt, act, stream, why, why_cap);
    if (!e)
        return 0;
    /* packed rows: cuDNN's statistics are token-major, lse's head-major (sdpa_layout.h) */
    float *stats = ragged ? stats_buffer((int64_t)B * T * NH) : (float *)x.lse;
    if (ragged && backward)
        attention_lse_transpose(stats, x.lse, B, T, NH, 1, stream);
    std::unordered_map<int64_t, void *> pack = {{UID_Q, at(x.qkv, L.q.offset)}, {UID_K, at(x.qkv, L.k.offset)},
                                                {UID_V, at(x.qkv, L.v.offset)}, {UID_O, (void *)x.out},
                                                {UID_STATS, stats}};
    if (backward) {
        pack[UID_DO] = (void *)x.dout;
        pack[UID_DQ] = at(x.dqkv, L.q.offset);
        pack[UID_DK] = at(x.dqkv, L.k.offset);
        pack[UID_DV] = at(x.dqkv, L.v.offset);
    }
    if (ragged)
        pack_ragged(pack, ragged, L.batch, backward);
    if (!run(*e, pack, why, why_cap))
        return 0;
    if (ragged && !backward)
        attention_lse_transpose((float *)x.lse, stats, B, T, NH, 0, stream);
    return 1;
}

extern "C" int cudnn_attention_forward(void *out, float *lse, const void *qkv, const int32_t *pos, int B, int T,
                                       int NH, int NKV, int hs, const struct attn_opts *opt, enum dtype act,
                                       cudaStream_t stream, char *why, size_t why_cap)
{
    const struct sdpa_tensors x = {qkv, out, nullptr, lse, nullptr};
    return attend(0, x, pos, B, T, NH, NKV, hs, opt, act, stream, why, why_cap);
}

extern "C" int cudnn_attention_backward(void *dqkv, const void *dout, const void *out, const void *qkv,
                                        const float *lse, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                                        const struct attn_opts *opt, enum dtype act, cudaStream_t stream, char *why,
                                        size_t why_cap)
{
    const struct sdpa_tensors x = {qkv, out, dout, lse, dqkv};
    return attend(1, x, pos, B, T, NH, NKV, hs, opt, act, stream, why, why_cap);
}

#else /* no cudnn-frontend or cuDNN headers, or tests/cudaemu: cuDNN is unavailable */

#include <stdio.h>

extern "C" long cudnn_attention_headers(void) { return 0; }

extern "C" long cudnn_attention_library(const char **why)
{
    if (why)
#ifdef CUDAEMU_RUNTIME_H
        *why = "tests/cudaemu does not emulate cuDNN";
#else
        *why = "built without cudnn-frontend's or cuDNN's headers (run tools/deps.sh, then make CUDA=1 again)";
#endif
    return 0;
}

extern "C" long backend_cuda_attention_cudnn_calls(void) { return 0; }

extern "C" int cudnn_attention_forward(void *out, float *lse, const void *qkv, const int32_t *pos, int B, int T,
                                       int NH, int NKV, int hs, const struct attn_opts *opt, enum dtype act,
                                       cudaStream_t stream, char *why, size_t why_cap)
{
    const char *missing;
    cudnn_attention_library(&missing);
    snprintf(why, why_cap, "%s", missing);
    return 0;
}

extern "C" int cudnn_attention_backward(void *dqkv, const void *dout, const void *out, const void *qkv,
                                        const float *lse, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                                        const struct attn_opts *opt, enum dtype act, cudaStream_t stream, char *why,
                                        size_t why_cap)
{
    return cudnn_attention_forward(dqkv, (float *)lse, qkv, pos, B, T, NH, NKV, hs, opt, act, stream, why, why_cap);
}
#endif
