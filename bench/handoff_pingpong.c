// Thread wake-up round trips for bench/handoff.py (built there with `cc -O2 -pthread -fopenmp -shared -fPIC`).
//
// hp_noop()                      does nothing: what one ctypes call from Python costs
// hp_condvar_pingpong(w, n, out) two threads hand a token back and forth through a pthread mutex +
//                                condition variable each (the waiter blocks in the kernel: futex);
//                                out[i] = ns of round trip i, after w warm-up round trips
// hp_spin_pingpong(w, n, out)    the same through one atomic flag that both threads spin on
// hp_callback_same_thread(cb, n, out)    calls the Python callback cb n times on the calling thread,
//                                        out[i] = ns of call i (ctypes re-takes the GIL each call)
// hp_callback_other_thread(cb, n, out)   the same from a new pthread, as a CUDA host function runs on
//                                        the driver's thread (ctypes: PyGILState_Ensure per call)
// hp_omp_region(t, w, n, gap_ns, out)    the OpenMP skeleton of one CPU expert kernel call (2 forks and
//                                        joins, 2 barriers, no work) at t threads: out[i] = ns of call i;
//                                        with gap_ns > 0 the caller sleeps that long before each call (the
//                                        team's threads then sleep past libgomp's spin window)
// All return 0, or -1 when a thread could not be started.
#define _GNU_SOURCE
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

int hp_noop(void) { return 0; }

// ---- condition variable: turn 0 = the main thread's, 1 = the partner's -------------------------------
struct cv_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int turn;
    int rounds;
};

static void* cv_partner(void* arg) {
    struct cv_state* s = arg;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->rounds; ++i) {
        while (s->turn != 1) pthread_cond_wait(&s->cv, &s->mu);
        s->turn = 0;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int hp_condvar_pingpong(int warmup, int n, double* out_ns) {
    struct cv_state s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, warmup + n};
    pthread_t th;
    if (pthread_create(&th, 0, cv_partner, &s)) return -1;
    pthread_mutex_lock(&s.mu);
    for (int i = 0; i < warmup + n; ++i) {
        const int64_t t0 = now_ns();
        s.turn = 1;
        pthread_cond_signal(&s.cv);
        while (s.turn != 0) pthread_cond_wait(&s.cv, &s.mu);
        const int64_t t1 = now_ns();
        if (i >= warmup) out_ns[i - warmup] = (double)(t1 - t0);
    }
    pthread_mutex_unlock(&s.mu);
    pthread_join(th, 0);
    return 0;
}

// ---- spinning flag: the main thread writes 2i+1, the partner answers 2i+2 --------------------------------
struct spin_state {
    _Atomic int64_t flag;
    int rounds;
};

static void* spin_partner(void* arg) {
    struct spin_state* s = arg;
    for (int64_t i = 0; i < s->rounds; ++i) {
        while (atomic_load_explicit(&s->flag, memory_order_acquire) != 2 * i + 1) cpu_relax();
        atomic_store_explicit(&s->flag, 2 * i + 2, memory_order_release);
    }
    return 0;
}

int hp_spin_pingpong(int warmup, int n, double* out_ns) {
    struct spin_state s;
    atomic_init(&s.flag, 0);
    s.rounds = warmup + n;
    pthread_t th;
    if (pthread_create(&th, 0, spin_partner, &s)) return -1;
    for (int64_t i = 0; i < warmup + n; ++i) {
        const int64_t t0 = now_ns();
        atomic_store_explicit(&s.flag, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&s.flag, memory_order_acquire) != 2 * i + 2) cpu_relax();
        const int64_t t1 = now_ns();
        if (i >= warmup) out_ns[i - warmup] = (double)(t1 - t0);
    }
    pthread_join(th, 0);
    return 0;
}

// ---- a callback into Python ---------------------------------------------------------------------------
typedef int (*hp_callback)(void);

struct cb_state {
    hp_callback cb;
    int n;
    double* out_ns;
};

static void* cb_run(void* arg) {
    struct cb_state* s = arg;
    for (int i = 0; i < s->n; ++i) {
        const int64_t t0 = now_ns();
        s->cb();
        s->out_ns[i] = (double)(now_ns() - t0);
    }
    return 0;
}

int hp_callback_same_thread(hp_callback cb, int n, double* out_ns) {
    struct cb_state s = {cb, n, out_ns};
    cb_run(&s);
    return 0;
}

int hp_callback_other_thread(hp_callback cb, int n, double* out_ns) {
    struct cb_state s = {cb, n, out_ns};
    pthread_t th;
    if (pthread_create(&th, 0, cb_run, &s)) return -1;
    pthread_join(th, 0);
    return 0;
}

// ---- OpenMP: the synchronization skeleton of one CPU expert kernel call ---------------------------------------
// templates/cpu/include/ostinato/entry.h + schedule.h with T = 1: a `parallel for` over the token rows (fork,
// join), then one parallel region whose two work-sharing loops (phase 1, phase 2) end in implicit barriers, and
// its join. (A bf16-dot build adds one more barrier.) No work inside: only forks, barriers and joins.
int hp_omp_region(int n_threads, int warmup, int n, int64_t gap_ns, double* out_ns) {
    volatile int sink = 0;
    for (int i = 0; i < warmup + n; ++i) {
        if (gap_ns > 0 && i >= warmup) {
            struct timespec ts = {(time_t)(gap_ns / 1000000000), (long)(gap_ns % 1000000000)};
            nanosleep(&ts, 0);
        }
        const int64_t t0 = now_ns();
#pragma omp parallel for schedule(static) num_threads(n_threads)
        for (int t = 0; t < 1; ++t) sink = sink + 1;
#pragma omp parallel num_threads(n_threads)
        {
#pragma omp barrier
#pragma omp barrier
        }
        const int64_t t1 = now_ns();
        if (i >= warmup) out_ns[i - warmup] = (double)(t1 - t0);
    }
    return sink == warmup + n ? 0 : -1;
}
