/*
 * ggml_expert_kernel.c: time ggml's (llama.cpp's) CPU MXFP4 MoE expert kernel on whole-layer calls of
 * DeepSeek-V4-Flash's routed experts (256 experts of D=4096 hidden, I=2048 intermediate, 13.4 MB of packed
 * MXFP4 each; top-6 routing), so that bench/kernel_side_by_side.py can set it beside Ostinato's kernel and
 * kt-kernel's.
 *
 * What runs is the graph llama.cpp's MoE layer builds for its routed experts (build_moe_ffn, the separate
 * gate/up path with DeepSeek-V4's clamped SwiGLU), with K routes per token:
 *     up   = mul_mat_id(up_exps,   x, ids)   up_exps:   MXFP4 [D, I, E]      -> [I, K, T]
 *     gate = mul_mat_id(gate_exps, x, ids)   gate_exps: MXFP4 [D, I, E]      -> [I, K, T]
 *     h    = swiglu_clamp(gate, up, 10)      min(gate, 10) silu'd, times up clamped to [-10, 10]
 *     y_k  = mul_mat_id(down_exps, h, ids) * weights   down_exps: MXFP4 [I, D, E]; weights [1, K, T]
 *     y    = y_0 + y_1 + ... + y_{K-1}       views of [D, K, T] added up, as build_moe_ffn aggregates
 * with float32 activations x [D, 1, T] (what llama.cpp's CPU path is handed) and ids [K, T] (int32: each
 * token's K experts, the top-k selection build_moe_ffn hands mul_mat_id). The weights are random bytes with
 * e8m0 scales 118..123 (finite values) and are placed the way llama.cpp places CPU expert weights: in the
 * first of the CPU backend's extra buffer types that takes this mul_mat_id (on x86 with AVX2 that is
 * CPU_REPACK, MXFP4 rows interleaved for its GEMV/GEMM), else plain CPU memory (--plain forces it). The
 * graph is computed by the CPU backend with a persistent ggml threadpool of --threads threads made with
 * ggml_threadpool_params_default (as llama.cpp's common init and llama-bench attach one: polling level
 * 50), built and allocated once per token count.
 *
 * Before timing, one call with T = 2 tokens, each routed to K experts spread over the layer with unequal
 * route weights, is checked against a plain C reference in double precision (its own MXFP4
 * dequantization), twice: on the exact float32 activations, and on activations rounded to Q8_0 as ggml's
 * MXFP4 dot product rounds them (8-bit integers, an fp16 scale per 32 values). Each largest error relative
 * to the output's largest magnitude is printed; the program exits 2 if the second is above 1e-2 (a wrong
 * layout, scale or routing is off by ~100%; a right one by ~1e-7) or the first above 5e-2 (the 8-bit
 * activations alone cost about 1% of the largest output).
 *
 * Output (stdout): `# ...` comment lines (the check), then one line `T ms` per token count: the median of
 * `--calls` calls with each token's K experts drawn uniformly at random (distinct), in milliseconds per
 * call (the graph compute only; setup and setting the ids are not timed); with --cpu-time, the process's
 * CPU seconds over the same span instead of the wall clock's (all its threads: a call's core-seconds).
 * `--serve` instead reads requests from stdin, one a line, and answers each with one line:
 *     `T C W PATH`  PATH holds (W + C) calls' ids, int32 [W + C][T][K], then their route weights, float32
 *                   [W + C][T][K]; the first W calls are warm-up, the next C are timed; answer:
 *                   `T ms_1 ... ms_C` (each timed call's milliseconds)
 * (weights and graphs stay set up between requests; EOF ends it). `--info` prints the ggml CPU features and
 * where the weights would go, and exits.
 *
 * Build (bench/ggml_kernel.py does this and caches the binary):
 *     cc -O2 -o ggml_expert_kernel bench/ggml_expert_kernel.c -I $LLAMA_CPP_SRC/ggml/include \
 *        -L $LLAMA_CPP_BUILD/bin -Wl,-rpath,$LLAMA_CPP_BUILD/bin -lggml -lggml-base -lggml-cpu -lm
 * Usage: ggml_expert_kernel [--threads N] [--experts E] [--top-k K] [--tokens 1,2,4,...] [--calls C]
 *                           [--plain] [--no-check] [--serve] [--info] [--cpu-time]
 */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#define D 4096
#define I 2048
#define BLOCK 32                /* values per MXFP4 block */
#define BLOCK_BYTES 17          /* one e8m0 scale byte + 16 bytes of nibbles */
#define MAX_T 4096
#define MAX_K 16
#define CHECK_T 2
#define SWIGLU_LIMIT 10.0f
#define CHECK_TOL_Q8 1e-2f      /* vs the reference with ggml's activation rounding: the layout is right */
#define CHECK_TOL_EXACT 5e-2f   /* vs the exact reference: 8-bit activations cost ~1% */

/* ---- random data ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng(void) {  /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static float rng_normal(void) {  /* Box-Muller */
    double u1 = ((rng() >> 11) + 1.0) / 9007199254740993.0, u2 = (rng() >> 11) / 9007199254740992.0;
    return (float) (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* n_blocks MXFP4 blocks in ggml's layout: byte 0 the e8m0 scale, then 16 bytes of nibbles */
static void fill_mxfp4(uint8_t *p, size_t n_blocks) {
    for (size_t b = 0; b < n_blocks; b++, p += BLOCK_BYTES) {
        uint64_t r0 = rng(), r1 = rng();
        p[0] = (uint8_t) (118 + (r0 >> 59) % 6);
        memcpy(p + 1, &r1, 8);
        r0 = rng();
        memcpy(p + 9, &r0, 8);
    }
}

/* ---- the float reference ---- */

/* One MXFP4 row of n values to floats. Values are e2m1 (sign, 2 exponent bits, 1 mantissa bit):
 * magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, times 2^(e - 127) for the block's scale byte e. ggml keeps the
 * magnitudes doubled (integers) and halves the scale instead: the same products. In a block, byte j of the
 * nibbles holds value j in its low nibble and value j + 16 in its high nibble. */
static void dequant_row(const uint8_t *row, int n, float *out) {
    static const float e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int b = 0; b < n / BLOCK; b++) {
        const uint8_t *blk = row + (size_t) b * BLOCK_BYTES;
        float s = ldexpf(1.0f, (int) blk[0] - 127);
        for (int j = 0; j < BLOCK / 2; j++) {
            out[b * BLOCK + j] = e2m1[blk[1 + j] & 0x0F] * s;
            out[b * BLOCK + j + BLOCK / 2] = e2m1[blk[1 + j] >> 4] * s;
        }
    }
}

/* Activations as ggml's CPU MXFP4 dot product sees them (its vec_dot_type is Q8_0): per block of 32, an
 * fp16 scale amax / 127 and integers round(v / scale). Rounding written out here; the fp16 conversion is ggml's. */
static void round_q8_0(float *v, int n) {
    for (int b = 0; b < n / BLOCK; b++) {
        float *p = v + b * BLOCK, amax = 0.0f;
        for (int j = 0; j < BLOCK; j++) amax = fmaxf(amax, fabsf(p[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f, d16 = ggml_fp16_to_fp32(ggml_fp32_to_fp16(d));
        for (int j = 0; j < BLOCK; j++) p[j] = roundf(p[j] * id) * d16;
    }
}

/* y = down @ swiglu_clamp(gate @ x, up @ x) for one token and one expert, in double, added to acc times
 * weight; w1, w3: I rows of D, w2: D rows of I. q8: round x and the SwiGLU output to Q8_0 first, as ggml does. */
static void reference(const uint8_t *w1, const uint8_t *w3, const uint8_t *w2, const float *x_in, int q8,
                      double weight, double *acc) {
    size_t row_d = (size_t) D / BLOCK * BLOCK_BYTES, row_i = (size_t) I / BLOCK * BLOCK_BYTES;
    float *wrow = malloc(sizeof(float) * D), *h = malloc(sizeof(float) * I), *x = malloc(sizeof(float) * D);
    memcpy(x, x_in, sizeof(float) * D);
    if (q8) round_q8_0(x, D);
    for (int r = 0; r < I; r++) {
        double g = 0, u = 0;
        dequant_row(w1 + r * row_d, D, wrow);
        for (int k = 0; k < D; k++) g += (double) wrow[k] * x[k];
        dequant_row(w3 + r * row_d, D, wrow);
        for (int k = 0; k < D; k++) u += (double) wrow[k] * x[k];
        g = fmin(g, SWIGLU_LIMIT);
        u = fmax(fmin(u, SWIGLU_LIMIT), -SWIGLU_LIMIT);
        h[r] = (float) (g / (1.0 + exp(-g)) * u);
    }
    if (q8) round_q8_0(h, I);
    for (int r = 0; r < D; r++) {
        double s = 0;
        dequant_row(w2 + r * row_i, I, wrow);
        for (int k = 0; k < I; k++) s += (double) wrow[k] * h[k];
        acc[r] += weight * s;
    }
    free(wrow);
    free(h);
    free(x);
}

/* ---- ggml ---- */

struct model {
    ggml_backend_t backend;
    struct ggml_threadpool *threadpool;
    ggml_backend_buffer_type_t weight_buft;
    struct ggml_context *ctx;
    ggml_backend_buffer_t buf;
    struct ggml_tensor *gate, *up, *down;
    int n_experts, top_k;
    int check_ids[CHECK_T * MAX_K];          /* the check call's ids, [CHECK_T][top_k] */
    float check_w[CHECK_T * MAX_K];          /* and its route weights */
    uint8_t *keep[3][CHECK_T * MAX_K];       /* host copies of those experts' gate, up and down bytes */
};

struct graph {  /* one per token count */
    struct ggml_context *ctx;
    struct ggml_cgraph *gf;
    ggml_gallocr_t alloc;
    struct ggml_tensor *x, *ids, *w, *y;
};

/* Would the device run mul_mat_id on MXFP4 experts [cols, rows, n] kept in a buffer of type buft? */
static int buft_takes(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, int cols, int rows, int n, int k) {
    struct ggml_init_params p = {ggml_tensor_overhead() * 8, NULL, true};
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_tensor *w = ggml_new_tensor_3d(ctx, GGML_TYPE_MXFP4, cols, rows, n);
    struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, cols, 1, 1);
    struct ggml_tensor *ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, k, 1);
    struct ggml_tensor *op = ggml_mul_mat_id(ctx, w, x, ids);
    ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(buft, 0);
    w->buffer = dummy;
    int ok = ggml_backend_dev_supports_op(dev, op);
    ggml_backend_buffer_free(dummy);
    ggml_free(ctx);
    return ok;
}

/* The buffer type llama.cpp would give CPU expert weights: the first extra buffer type that takes both
 * shapes' mul_mat_id, else the CPU's own. */
static ggml_backend_buffer_type_t pick_weight_buft(ggml_backend_t backend, int n_experts, int k, int plain) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    if (!plain) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        ggml_backend_dev_get_extra_bufts_t extra =
            (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
        for (ggml_backend_buffer_type_t *b = extra ? extra(dev) : NULL; b && *b; b++)
            if (buft_takes(dev, *b, D, I, n_experts, k) && buft_takes(dev, *b, I, D, n_experts, k)) return *b;
    }
    return ggml_backend_cpu_buffer_type();
}

static void load_model(struct model *m, int threads, int n_experts, int top_k, int plain) {
    m->backend = ggml_backend_cpu_init();
    if (!m->backend) { fprintf(stderr, "ggml_backend_cpu_init failed\n"); exit(1); }
    ggml_backend_cpu_set_n_threads(m->backend, threads);
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    m->threadpool = ggml_threadpool_new(&tpp);
    if (!m->threadpool) { fprintf(stderr, "ggml_threadpool_new failed\n"); exit(1); }
    ggml_backend_cpu_set_threadpool(m->backend, m->threadpool);
    m->n_experts = n_experts;
    m->top_k = top_k;
    m->weight_buft = pick_weight_buft(m->backend, n_experts, top_k, plain);

    /* the check call: token t's slot j goes to expert t + j * (E / K), weight (j + 1) / (K (K + 1) / 2) */
    for (int t = 0; t < CHECK_T; t++)
        for (int j = 0; j < top_k; j++) {
            m->check_ids[t * top_k + j] = (t + j * (n_experts / top_k)) % n_experts;
            m->check_w[t * top_k + j] = (float) (j + 1) / (float) (top_k * (top_k + 1) / 2);
        }

    struct ggml_init_params p = {ggml_tensor_overhead() * 4, NULL, true};
    m->ctx = ggml_init(p);
    m->gate = ggml_new_tensor_3d(m->ctx, GGML_TYPE_MXFP4, D, I, n_experts);
    m->up = ggml_new_tensor_3d(m->ctx, GGML_TYPE_MXFP4, D, I, n_experts);
    m->down = ggml_new_tensor_3d(m->ctx, GGML_TYPE_MXFP4, I, D, n_experts);
    m->buf = ggml_backend_alloc_ctx_tensors_from_buft(m->ctx, m->weight_buft);
    if (!m->buf) { fprintf(stderr, "could not allocate the expert weights\n"); exit(1); }
    ggml_backend_buffer_set_usage(m->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    struct ggml_tensor *ts[3] = {m->gate, m->up, m->down};
    for (int i = 0; i < 3; i++) {
        size_t bytes = ggml_nbytes(ts[i]), per_expert = bytes / n_experts;
        if (per_expert != (size_t) D * I / BLOCK * BLOCK_BYTES) { fprintf(stderr, "unexpected MXFP4 size\n"); exit(1); }
        uint8_t *host = malloc(bytes);
        if (!host) { fprintf(stderr, "out of memory for %zu bytes of experts\n", bytes); exit(1); }
        fill_mxfp4(host, bytes / BLOCK_BYTES);
        for (int r = 0; r < CHECK_T * top_k; r++) {
            m->keep[i][r] = malloc(per_expert);
            memcpy(m->keep[i][r], host + (size_t) m->check_ids[r] * per_expert, per_expert);
        }
        ggml_backend_tensor_set(ts[i], host, 0, bytes);  /* a repacking buffer repacks here */
        free(host);
    }
}

static struct graph *build_graph(struct model *m, int T) {
    int K = m->top_k;
    struct graph *g = calloc(1, sizeof *g);
    struct ggml_init_params p = {ggml_tensor_overhead() * (32 + 2 * MAX_K) + ggml_graph_overhead(), NULL, true};
    g->ctx = ggml_init(p);
    g->x = ggml_new_tensor_3d(g->ctx, GGML_TYPE_F32, D, 1, T);
    g->ids = ggml_new_tensor_2d(g->ctx, GGML_TYPE_I32, K, T);
    g->w = ggml_new_tensor_3d(g->ctx, GGML_TYPE_F32, 1, K, T);
    struct ggml_tensor *in[3] = {g->x, g->ids, g->w};
    for (int i = 0; i < 3; i++) {  /* inputs, and kept as set: the allocator may not reuse their memory */
        ggml_set_input(in[i]);
        ggml_set_output(in[i]);
    }
    g->gf = ggml_new_graph(g->ctx);
    struct ggml_tensor *up = ggml_mul_mat_id(g->ctx, m->up, g->x, g->ids);      /* [I, K, T] */
    struct ggml_tensor *gate = ggml_mul_mat_id(g->ctx, m->gate, g->x, g->ids);  /* [I, K, T] */
    struct ggml_tensor *h = ggml_swiglu_clamp(g->ctx, gate, up, SWIGLU_LIMIT);
    struct ggml_tensor *experts = ggml_mul_mat_id(g->ctx, m->down, h, g->ids);  /* [D, K, T] */
    experts = ggml_mul(g->ctx, experts, g->w);
    ggml_build_forward_expand(g->gf, experts);
    struct ggml_tensor *views[MAX_K] = {0};
    for (int k = 0; k < K; k++) {  /* as build_moe_ffn: the views first, then the adds */
        views[k] = ggml_view_2d(g->ctx, experts, D, T, experts->nb[2], (size_t) k * experts->nb[1]);
        ggml_build_forward_expand(g->gf, views[k]);
    }
    struct ggml_tensor *y = views[0];
    for (int k = 1; k < K; k++) {
        y = ggml_add(g->ctx, y, views[k]);
        ggml_build_forward_expand(g->gf, y);
    }
    if (K == 1) y = ggml_cont(g->ctx, y);
    g->y = y;
    ggml_set_output(g->y);
    ggml_build_forward_expand(g->gf, g->y);
    g->alloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
    if (!ggml_gallocr_alloc_graph(g->alloc, g->gf)) { fprintf(stderr, "graph allocation failed\n"); exit(1); }

    float *buf = malloc(sizeof(float) * D * T);
    for (int i = 0; i < D * T; i++) buf[i] = rng_normal();
    ggml_backend_tensor_set(g->x, buf, 0, sizeof(float) * D * T);
    free(buf);
    return g;
}

/* One call's routes: ids [T][K], weights [T][K] */
static void set_routes(struct graph *g, int T, int K, const int32_t *ids, const float *w) {
    ggml_backend_tensor_set(g->ids, ids, 0, sizeof(int32_t) * T * K);
    ggml_backend_tensor_set(g->w, w, 0, sizeof(float) * T * K);
}

/* --cpu-time: the process's CPU time (every thread's, its threadpool's polling included) instead of the
 * wall clock, so a call costs its core-seconds whatever else the machine runs meanwhile */
static clockid_t timing_clock = CLOCK_MONOTONIC;

static double now(void) {
    struct timespec ts;
    clock_gettime(timing_clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void compute(struct model *m, struct graph *g) {
    if (ggml_backend_graph_compute(m->backend, g->gf) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph compute failed\n");
        exit(1);
    }
}

/* Seconds of each of `calls` computes after `warmup` untimed ones; call c's routes at ids/w + c * T * K
 * (the routes are set outside the timed part). */
static void time_calls(struct model *m, struct graph *g, int T, int warmup, int calls, const int32_t *ids,
                       const float *w, double *secs) {
    size_t step = (size_t) T * m->top_k;
    for (int c = 0; c < warmup + calls; c++) {
        set_routes(g, T, m->top_k, ids + c * step, w + c * step);
        double t = now();
        compute(m, g);
        if (c >= warmup) secs[c - warmup] = now() - t;
    }
}

/* K distinct experts out of E, uniformly (partial Fisher-Yates), weights ~ 1/K */
static void random_routes(int T, int K, int E, int32_t *ids, float *w) {
    int32_t *perm = malloc(sizeof(int32_t) * E);
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int j = 0; j < K; j++) {
            int r = j + (int) (rng() % (uint64_t) (E - j)), tmp = perm[j];
            perm[j] = perm[r];
            perm[r] = tmp;
            ids[t * K + j] = perm[j];
            w[t * K + j] = 1.0f / K;
        }
    }
    free(perm);
}

/* Largest |y - ref| over the largest |ref| */
static double rel_err(const float *y, const double *ref, int n, double *err_out, double *amax_out) {
    double err = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(y[i])) return INFINITY;
        err = fmax(err, fabs((double) y[i] - ref[i]));
        amax = fmax(amax, fabs(ref[i]));
    }
    *err_out = err;
    *amax_out = amax;
    return amax > 0 ? err / amax : INFINITY;
}

/* T = CHECK_T tokens, K routes each, against the float reference, exact and with ggml's Q8_0 activation
 * rounding; returns nonzero if either is off by more than its bound. */
static int check(struct model *m, struct graph *g) {
    int K = m->top_k;
    static float x[CHECK_T * D], y[CHECK_T * D];
    static double ref[CHECK_T * D], ref8[CHECK_T * D];
    set_routes(g, CHECK_T, K, m->check_ids, m->check_w);
    compute(m, g);
    ggml_backend_tensor_get(g->x, x, 0, sizeof x);
    ggml_backend_tensor_get(g->y, y, 0, sizeof y);
    memset(ref, 0, sizeof ref);
    memset(ref8, 0, sizeof ref8);
    for (int t = 0; t < CHECK_T; t++)
        for (int j = 0; j < K; j++) {
            int r = t * K + j;
            reference(m->keep[0][r], m->keep[1][r], m->keep[2][r], x + t * D, 0, m->check_w[r], ref + t * D);
            reference(m->keep[0][r], m->keep[1][r], m->keep[2][r], x + t * D, 1, m->check_w[r], ref8 + t * D);
        }
    double err, amax, err8, amax8;
    double rel = rel_err(y, ref, CHECK_T * D, &err, &amax), rel8 = rel_err(y, ref8, CHECK_T * D, &err8, &amax8);
    printf("# check: T=%d tokens x %d experts vs the float reference: max_abs_err=%.4g max_abs_out=%.4g "
           "rel_err=%.3e (ggml rounds activations to 8 bits)\n", CHECK_T, K, err, amax, rel);
    printf("# check: the same vs the float reference with Q8_0-rounded activations: max_abs_err=%.4g "
           "rel_err_q8=%.3e\n", err8, rel8);
    fflush(stdout);
    if (rel8 > CHECK_TOL_Q8 || rel > CHECK_TOL_EXACT) {
        fprintf(stderr, "ggml's output is off the float reference: rel_err_q8 %.3e (bound %g), rel_err %.3e (bound %g)\n",
                rel8, CHECK_TOL_Q8, rel, CHECK_TOL_EXACT);
        return 1;
    }
    return 0;
}

static void print_info(int threads, int n_experts, int top_k, int plain) {
    struct { const char *name; int (*has)(void); } feats[] = {
        {"AVX2", ggml_cpu_has_avx2}, {"FMA", ggml_cpu_has_fma}, {"F16C", ggml_cpu_has_f16c},
        {"AVX_VNNI", ggml_cpu_has_avx_vnni}, {"AVX512", ggml_cpu_has_avx512},
        {"AVX512_VBMI", ggml_cpu_has_avx512_vbmi}, {"AVX512_VNNI", ggml_cpu_has_avx512_vnni},
        {"AVX512_BF16", ggml_cpu_has_avx512_bf16}, {"AMX_INT8", ggml_cpu_has_amx_int8},
        {"NEON", ggml_cpu_has_neon}, {"DOTPROD", ggml_cpu_has_dotprod}, {"MATMUL_INT8", ggml_cpu_has_matmul_int8},
        {"SVE", ggml_cpu_has_sve}, {"LLAMAFILE", ggml_cpu_has_llamafile},
    };
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, threads);
    ggml_backend_buffer_type_t buft = pick_weight_buft(be, n_experts, top_k, plain);
    printf("ggml %s (%s)\n", ggml_version(), ggml_commit());
    printf("cpu_features:");
    for (size_t i = 0; i < sizeof feats / sizeof feats[0]; i++)
        if (feats[i].has()) printf(" %s", feats[i].name);
    printf("\nweights_buffer: %s\n", ggml_backend_buft_name(buft));
    ggml_backend_free(be);
}

static void usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--threads N] [--experts E] [--top-k K] [--tokens 1,2,4,...] [--calls C] [--plain] "
                    "[--no-check] [--serve] [--info] [--cpu-time]\n", argv0);
    exit(1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static struct graph *graph_for(struct model *m, struct graph **graphs, int T) {
    if (!graphs[T]) graphs[T] = build_graph(m, T);
    return graphs[T];
}

/* `T C W PATH`: answer `T ms_1 ... ms_C`, or `error: ...` */
static void serve_one(struct model *m, struct graph **graphs, const char *line) {
    int T, C, W;
    char path[4096];
    if (sscanf(line, "%d %d %d %4095s", &T, &C, &W, path) != 4 || T < 1 || T > MAX_T || C < 1 || W < 0) {
        printf("error: expected `T calls warmup path` with 1 <= T <= %d\n", MAX_T);
        return;
    }
    size_t n = (size_t) (W + C) * T * m->top_k;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    float *w = malloc(sizeof(float) * n);
    double *secs = malloc(sizeof(double) * C);
    FILE *f = fopen(path, "rb");
    int ok = f && fread(ids, sizeof(int32_t), n, f) == n && fread(w, sizeof(float), n, f) == n;
    if (f) fclose(f);
    for (size_t i = 0; ok && i < n; i++) ok = ids[i] >= 0 && ids[i] < m->n_experts;
    if (!ok) {
        printf("error: %s does not hold %zu ids in 0..%d and %zu weights\n", path, n, m->n_experts - 1, n);
    } else {
        time_calls(m, graph_for(m, graphs, T), T, W, C, ids, w, secs);
        printf("%d", T);
        for (int c = 0; c < C; c++) printf(" %.6f", secs[c] * 1e3);
        printf("\n");
    }
    free(ids);
    free(w);
    free(secs);
}

int main(int argc, char **argv) {
    int threads = 1, calls = 5, n_experts = 256, top_k = 6, plain = 0, do_check = 1, serve = 0, info = 0;
    int tokens[64], n_tokens = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--calls") && i + 1 < argc) calls = atoi(argv[++i]);
        else if (!strcmp(a, "--experts") && i + 1 < argc) n_experts = atoi(argv[++i]);
        else if (!strcmp(a, "--top-k") && i + 1 < argc) top_k = atoi(argv[++i]);
        else if (!strcmp(a, "--tokens") && i + 1 < argc) {
            for (char *s = strtok(argv[++i], ","); s && n_tokens < 64; s = strtok(NULL, ",")) tokens[n_tokens++] = atoi(s);
        }
        else if (!strcmp(a, "--plain")) plain = 1;
        else if (!strcmp(a, "--no-check")) do_check = 0;
        else if (!strcmp(a, "--serve")) serve = 1;
        else if (!strcmp(a, "--info")) info = 1;
        else if (!strcmp(a, "--cpu-time")) timing_clock = CLOCK_PROCESS_CPUTIME_ID;
        else usage(argv[0]);
    }
    if (threads < 1 || calls < 1 || top_k < 1 || top_k > MAX_K || n_experts < top_k) usage(argv[0]);
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 1 || tokens[i] > MAX_T) { fprintf(stderr, "token counts must be 1..%d\n", MAX_T); return 1; }
    if (info) {
        print_info(threads, n_experts, top_k, plain);
        return 0;
    }
    if (!n_tokens && !serve) {
        static const int dflt[] = {1, 2, 4, 8, 16, 32, 64};
        memcpy(tokens, dflt, sizeof dflt);
        n_tokens = 7;
    }

    struct model m;
    load_model(&m, threads, n_experts, top_k, plain);
    printf("# %d experts x %.1f MB in %s, top-%d, %d threads\n", n_experts,
           ggml_nbytes(m.gate) * 3.0 / n_experts / 1e6, ggml_backend_buft_name(m.weight_buft), top_k, threads);
    fflush(stdout);

    static struct graph *graphs[MAX_T + 1];
    if (do_check && check(&m, graph_for(&m, graphs, CHECK_T))) return 2;

    if (serve) {
        static char line[8192];
        while (fgets(line, sizeof line, stdin)) {
            serve_one(&m, graphs, line);
            fflush(stdout);
        }
    } else {
        for (int i = 0; i < n_tokens; i++) {
            int T = tokens[i];
            size_t n = (size_t) (1 + calls) * T * top_k;
            int32_t *ids = malloc(sizeof(int32_t) * n);
            float *w = malloc(sizeof(float) * n);
            double *secs = malloc(sizeof(double) * calls);
            random_routes((1 + calls) * T, top_k, n_experts, ids, w);
            time_calls(&m, graph_for(&m, graphs, T), T, 1, calls, ids, w, secs);
            qsort(secs, calls, sizeof(double), cmp_double);
            double med = calls % 2 ? secs[calls / 2] : 0.5 * (secs[calls / 2 - 1] + secs[calls / 2]);
            printf("%d %.6f\n", T, med * 1e3);
            fflush(stdout);
            free(ids);
            free(w);
            free(secs);
        }
    }

    for (int T = 0; T <= MAX_T; T++)
        if (graphs[T]) {
            ggml_gallocr_free(graphs[T]->alloc);
            ggml_free(graphs[T]->ctx);
            free(graphs[T]);
        }
    ggml_backend_buffer_free(m.buf);
    ggml_free(m.ctx);
    ggml_backend_free(m.backend);
    ggml_threadpool_free(m.threadpool);
    for (int i = 0; i < 3; i++)
        for (int r = 0; r < CHECK_T * top_k; r++) free(m.keep[i][r]);
    return 0;
}
