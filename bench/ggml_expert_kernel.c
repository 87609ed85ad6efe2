/*
 * ggml_expert_kernel.c: time ggml's (llama.cpp's) CPU MXFP4 MoE expert kernel on DeepSeek-V4-Flash's
 * expert shape (D=4096 hidden, I=2048 intermediate; 13.4 MB of packed MXFP4 per expert), so that
 * bench/cpu_experts.py can set it beside Ostinato's kernel and kt-kernel's.
 *
 * What runs is the graph llama.cpp's MoE layer builds for its routed experts (build_moe_ffn, the separate
 * gate/up path with DeepSeek-V4's clamped SwiGLU):
 *     gate = mul_mat_id(gate_exps, x, ids)   gate_exps: MXFP4 [D, I, N]
 *     up   = mul_mat_id(up_exps,   x, ids)   up_exps:   MXFP4 [D, I, N]
 *     h    = swiglu_clamp(gate, up, 10)      min(gate, 10) silu'd, times up clamped to [-10, 10]
 *     y    = mul_mat_id(down_exps, h, ids) * route weight     down_exps: MXFP4 [I, D, N]
 * with float32 activations x [D, 1, T] (what llama.cpp's CPU path is handed) and ids [1, T] routing all T
 * tokens to one expert (k = 1 route per token); the expert moves on from call to call, so with enough
 * experts (--experts) the weights come from DRAM, not the cache. The weights are random bytes with
 * e8m0 scales 118..123 (finite values) and are placed the way llama.cpp places CPU expert weights: in
 * the first of the CPU backend's extra buffer types that takes this mul_mat_id (on x86 with AVX2 that is
 * CPU_REPACK, MXFP4 rows interleaved 8 x 8 for its GEMV/GEMM), else plain CPU memory (--plain forces it).
 * The graph is computed by the CPU backend (ggml_backend_graph_compute, --threads threads), built and
 * allocated once per token count.
 *
 * Before timing, one call with T = 1 is checked against a plain C reference of the same expert in double
 * precision (its own MXFP4 dequantization), twice: on the exact float32 activations, and on activations
 * rounded to Q8_0 as ggml's MXFP4 dot product rounds them (8-bit integers, an fp16 scale per 32 values).
 * Each largest error relative to the output's largest magnitude is printed; the program exits 2 if the
 * second is above 1e-2 (a wrong layout or scale is off by ~100%; a right one by ~1e-7) or the first
 * above 5e-2 (the 8-bit activations alone cost about 1% of the largest output).
 *
 * Output (stdout): `# ...` comment lines (the check), then one line `T ms` per token count: the best of
 * `--calls` calls, in milliseconds per expert call (the graph compute only; setup is not timed).
 * `--serve` instead reads lines `T calls` from stdin and answers each with `T ms` (weights and graphs
 * stay set up between requests; EOF ends it). `--info` prints the ggml CPU features and where the
 * weights would go, and exits.
 *
 * Build (bench/ggml_kernel.py does this and caches the binary):
 *     cc -O2 -o ggml_expert_kernel bench/ggml_expert_kernel.c -I $LLAMA_CPP_SRC/ggml/include \
 *        -L $LLAMA_CPP_BUILD/bin -Wl,-rpath,$LLAMA_CPP_BUILD/bin -lggml -lggml-base -lggml-cpu -lm
 * Usage: ggml_expert_kernel [--threads N] [--tokens 1,2,4,...] [--calls C] [--experts N] [--plain]
 *                           [--no-check] [--serve] [--info]
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
#define SWIGLU_LIMIT 10.0f
#define ROUTE_WEIGHT 0.5f
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

/* y = ROUTE_WEIGHT * down @ swiglu_clamp(gate @ x, up @ x) for one token, in double; w1, w3: I rows of D,
 * w2: D rows of I. q8: round x and the SwiGLU output to Q8_0 first, as ggml does. */
static void reference(const uint8_t *w1, const uint8_t *w3, const uint8_t *w2, const float *x_in, int q8, float *y) {
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
        double acc = 0;
        dequant_row(w2 + r * row_i, I, wrow);
        for (int k = 0; k < I; k++) acc += (double) wrow[k] * h[k];
        y[r] = (float) (ROUTE_WEIGHT * acc);
    }
    free(wrow);
    free(h);
    free(x);
}

/* ---- ggml ---- */

struct model {
    ggml_backend_t backend;
    ggml_backend_buffer_type_t weight_buft;
    struct ggml_context *ctx;
    ggml_backend_buffer_t buf;
    struct ggml_tensor *gate, *up, *down;
    int n_experts;
    uint8_t *keep[3];  /* host copies of expert 0's gate, up and down bytes (for the check) */
};

struct graph {  /* one per token count */
    struct ggml_context *ctx;
    struct ggml_cgraph *gf;
    ggml_gallocr_t alloc;
    struct ggml_tensor *x, *ids, *w, *y;
};

/* Would the device run mul_mat_id on MXFP4 experts [cols, rows, n] kept in a buffer of type buft? */
static int buft_takes(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, int cols, int rows, int n) {
    struct ggml_init_params p = {ggml_tensor_overhead() * 8, NULL, true};
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_tensor *w = ggml_new_tensor_3d(ctx, GGML_TYPE_MXFP4, cols, rows, n);
    struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, cols, 1, 1);
    struct ggml_tensor *ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, 1);
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
static ggml_backend_buffer_type_t pick_weight_buft(ggml_backend_t backend, int n_experts, int plain) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    if (!plain) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        ggml_backend_dev_get_extra_bufts_t extra =
            (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
        for (ggml_backend_buffer_type_t *b = extra ? extra(dev) : NULL; b && *b; b++)
            if (buft_takes(dev, *b, D, I, n_experts) && buft_takes(dev, *b, I, D, n_experts)) return *b;
    }
    return ggml_backend_cpu_buffer_type();
}

static void load_model(struct model *m, int threads, int n_experts, int plain) {
    m->backend = ggml_backend_cpu_init();
    if (!m->backend) { fprintf(stderr, "ggml_backend_cpu_init failed\n"); exit(1); }
    ggml_backend_cpu_set_n_threads(m->backend, threads);
    m->n_experts = n_experts;
    m->weight_buft = pick_weight_buft(m->backend, n_experts, plain);

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
        fill_mxfp4(host, bytes / BLOCK_BYTES);
        ggml_backend_tensor_set(ts[i], host, 0, bytes);  /* a repacking buffer repacks here */
        m->keep[i] = malloc(per_expert);
        memcpy(m->keep[i], host, per_expert);
        free(host);
    }
}

static struct graph *build_graph(struct model *m, int T) {
    struct graph *g = calloc(1, sizeof *g);
    struct ggml_init_params p = {ggml_tensor_overhead() * 32 + ggml_graph_overhead(), NULL, true};
    g->ctx = ggml_init(p);
    g->x = ggml_new_tensor_3d(g->ctx, GGML_TYPE_F32, D, 1, T);
    g->ids = ggml_new_tensor_2d(g->ctx, GGML_TYPE_I32, 1, T);
    g->w = ggml_new_tensor_3d(g->ctx, GGML_TYPE_F32, 1, 1, T);
    struct ggml_tensor *in[3] = {g->x, g->ids, g->w};
    for (int i = 0; i < 3; i++) {  /* inputs, and kept as set: the allocator may not reuse their memory */
        ggml_set_input(in[i]);
        ggml_set_output(in[i]);
    }
    struct ggml_tensor *up = ggml_mul_mat_id(g->ctx, m->up, g->x, g->ids);      /* [I, 1, T] */
    struct ggml_tensor *gate = ggml_mul_mat_id(g->ctx, m->gate, g->x, g->ids);  /* [I, 1, T] */
    struct ggml_tensor *h = ggml_swiglu_clamp(g->ctx, gate, up, SWIGLU_LIMIT);
    struct ggml_tensor *down = ggml_mul_mat_id(g->ctx, m->down, h, g->ids);     /* [D, 1, T] */
    g->y = ggml_mul(g->ctx, down, g->w);
    ggml_set_output(g->y);
    g->gf = ggml_new_graph(g->ctx);
    ggml_build_forward_expand(g->gf, g->y);
    g->alloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
    if (!ggml_gallocr_alloc_graph(g->alloc, g->gf)) { fprintf(stderr, "graph allocation failed\n"); exit(1); }

    float *buf = malloc(sizeof(float) * D * T);
    for (int i = 0; i < D * T; i++) buf[i] = rng_normal();
    ggml_backend_tensor_set(g->x, buf, 0, sizeof(float) * D * T);
    for (int i = 0; i < T; i++) buf[i] = ROUTE_WEIGHT;
    ggml_backend_tensor_set(g->w, buf, 0, sizeof(float) * T);
    free(buf);
    return g;
}

static void route_all_to(struct graph *g, int T, int expert) {
    int32_t ids[MAX_T];
    for (int i = 0; i < T; i++) ids[i] = expert;
    ggml_backend_tensor_set(g->ids, ids, 0, sizeof(int32_t) * T);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int next_expert = 0;

/* Best seconds of `calls` computes, each on the next expert (ids set outside the timed part). */
static double time_calls(struct model *m, struct graph *g, int T, int calls) {
    double best = INFINITY;
    for (int c = 0; c < calls; c++) {
        route_all_to(g, T, next_expert);
        next_expert = (next_expert + 1) % m->n_experts;
        double t = now();
        if (ggml_backend_graph_compute(m->backend, g->gf) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "graph compute failed\n");
            exit(1);
        }
        t = now() - t;
        if (t < best) best = t;
    }
    return best;
}

/* Largest |y - ref| over the largest |ref| */
static double rel_err(const float *y, const float *ref, double *err_out, double *amax_out) {
    double err = 0, amax = 0;
    for (int i = 0; i < D; i++) {
        if (!isfinite(y[i])) return INFINITY;
        err = fmax(err, fabs((double) y[i] - ref[i]));
        amax = fmax(amax, fabs((double) ref[i]));
    }
    *err_out = err;
    *amax_out = amax;
    return amax > 0 ? err / amax : INFINITY;
}

/* T = 1 on expert 0 against the float reference, exact and with ggml's Q8_0 activation rounding;
 * returns nonzero if either is off by more than its bound. */
static int check(struct model *m, struct graph *g1) {
    static float x[D], y[D], ref[D], ref8[D];
    route_all_to(g1, 1, 0);
    if (ggml_backend_graph_compute(m->backend, g1->gf) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); exit(1); }
    ggml_backend_tensor_get(g1->x, x, 0, sizeof x);
    ggml_backend_tensor_get(g1->y, y, 0, sizeof y);
    reference(m->keep[0], m->keep[1], m->keep[2], x, 0, ref);
    reference(m->keep[0], m->keep[1], m->keep[2], x, 1, ref8);
    double err, amax, err8, amax8, rel = rel_err(y, ref, &err, &amax), rel8 = rel_err(y, ref8, &err8, &amax8);
    printf("# check: T=1 expert 0 vs the float reference: max_abs_err=%.4g max_abs_out=%.4g rel_err=%.3e "
           "(ggml rounds activations to 8 bits)\n", err, amax, rel);
    printf("# check: T=1 expert 0 vs the float reference with Q8_0-rounded activations: max_abs_err=%.4g "
           "rel_err_q8=%.3e\n", err8, rel8);
    fflush(stdout);
    if (rel8 > CHECK_TOL_Q8 || rel > CHECK_TOL_EXACT) {
        fprintf(stderr, "ggml's output is off the float reference: rel_err_q8 %.3e (bound %g), rel_err %.3e (bound %g)\n",
                rel8, CHECK_TOL_Q8, rel, CHECK_TOL_EXACT);
        return 1;
    }
    return 0;
}

static void print_info(int threads, int n_experts, int plain) {
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
    ggml_backend_buffer_type_t buft = pick_weight_buft(be, n_experts, plain);
    printf("ggml %s (%s)\n", ggml_version(), ggml_commit());
    printf("cpu_features:");
    for (size_t i = 0; i < sizeof feats / sizeof feats[0]; i++)
        if (feats[i].has()) printf(" %s", feats[i].name);
    printf("\nweights_buffer: %s\n", ggml_backend_buft_name(buft));
    ggml_backend_free(be);
}

static void usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--threads N] [--tokens 1,2,4,...] [--calls C] [--experts N] [--plain] [--no-check] "
                    "[--serve] [--info]\n", argv0);
    exit(1);
}

int main(int argc, char **argv) {
    int threads = 1, calls = 5, n_experts = 8, plain = 0, do_check = 1, serve = 0, info = 0;
    int tokens[64], n_tokens = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--calls") && i + 1 < argc) calls = atoi(argv[++i]);
        else if (!strcmp(a, "--experts") && i + 1 < argc) n_experts = atoi(argv[++i]);
        else if (!strcmp(a, "--tokens") && i + 1 < argc) {
            for (char *s = strtok(argv[++i], ","); s && n_tokens < 64; s = strtok(NULL, ",")) tokens[n_tokens++] = atoi(s);
        }
        else if (!strcmp(a, "--plain")) plain = 1;
        else if (!strcmp(a, "--no-check")) do_check = 0;
        else if (!strcmp(a, "--serve")) serve = 1;
        else if (!strcmp(a, "--info")) info = 1;
        else usage(argv[0]);
    }
    if (threads < 1 || calls < 1 || n_experts < 1) usage(argv[0]);
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 1 || tokens[i] > MAX_T) { fprintf(stderr, "token counts must be 1..%d\n", MAX_T); return 1; }
    if (info) {
        print_info(threads, n_experts, plain);
        return 0;
    }
    if (!n_tokens && !serve) {
        static const int dflt[] = {1, 2, 4, 8, 16, 32, 64};
        memcpy(tokens, dflt, sizeof dflt);
        n_tokens = 7;
    }

    struct model m;
    load_model(&m, threads, n_experts, plain);
    printf("# %d experts x %.1f MB in %s, %d threads\n", n_experts,
           ggml_nbytes(m.gate) * 3.0 / n_experts / 1e6, ggml_backend_buft_name(m.weight_buft), threads);
    fflush(stdout);

    struct graph *graphs[MAX_T + 1] = {0};
    if (do_check) {
        graphs[1] = build_graph(&m, 1);
        if (check(&m, graphs[1])) return 2;
    }

    if (serve) {
        char line[256];
        while (fgets(line, sizeof line, stdin)) {
            int T, c;
            if (sscanf(line, "%d %d", &T, &c) != 2 || T < 1 || T > MAX_T || c < 1) {
                printf("error: expected `T calls` with 1 <= T <= %d\n", MAX_T);
                fflush(stdout);
                continue;
            }
            if (!graphs[T]) {
                graphs[T] = build_graph(&m, T);
                time_calls(&m, graphs[T], T, 1);  /* first compute sizes the backend's work buffer */
            }
            printf("%d %.6f\n", T, time_calls(&m, graphs[T], T, c) * 1e3);
            fflush(stdout);
        }
    } else {
        for (int i = 0; i < n_tokens; i++) {
            int T = tokens[i];
            if (!graphs[T]) {
                graphs[T] = build_graph(&m, T);
                time_calls(&m, graphs[T], T, 1);
            }
            printf("%d %.6f\n", T, time_calls(&m, graphs[T], T, calls) * 1e3);
            fflush(stdout);
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
    for (int i = 0; i < 3; i++) free(m.keep[i]);
    return 0;
}
