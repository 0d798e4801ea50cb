/* ddptop's NCCL profiler plugin: each all-reduce's kernel time from the GPU's own clock.
 *
 * NCCL (>= 2.28, profiler interface v5) loads this library when NCCL_PROFILER_PLUGIN names
 * it (ddptop's launcher builds it into the run's private directory and sets that). With the
 * kernel-channel events on, every channel of a collective's kernel writes %globaltimer when
 * it starts and when it ends, and NCCL's proxy thread hands both to stopEvent/recordEventState
 * here. An all-reduce's kernel time is its last channel's end minus its first channel's start:
 * what a trace's NCCL kernel shows, without the launch latency that NCCL's own start/end CUDA
 * events (TORCH_NCCL_ENABLE_TIMING) carry on a rank whose collectives wait for nothing.
 *
 * The rank's Python side (ddptop.rank.kernel_clock) opens this same library with ctypes and
 * calls ddptop_nccl_take() to collect finished all-reduces (host issue time, kernel ns), and
 * ddptop_nccl_enable() to switch the events off and on (the cost A/B's bypassed steps).
 *
 * The structs below are NCCL's v5 ABI (src/include/plugin/profiler/profiler_v5.h), reduced to
 * the members read here; the union's offset and the members' offsets are NCCL's.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef int ncclResult_t; /* ncclSuccess = 0 */
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

enum { PROFILE_COLL = 1 << 1, PROFILE_KERNEL_CH = 1 << 6 };
enum { STATE_KERNEL_CH_STOP = 22 };

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      uint8_t channelId;
      uint64_t pTimer; /* the channel's start, GPU globaltimer ns */
    } kernelCh;
    char other[96]; /* the members not read here (groupApi, p2p, proxyOp, ...) */
  };
} descr_v5;

typedef union {
  struct {
    uint64_t pTimer; /* the channel's end, GPU globaltimer ns */
  } kernelCh;
  char other[16];
} state_args_v5;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, descr_v5* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, int eState, state_args_v5* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} profiler_v5;

#define MAX_CH 64      /* channels a collective may use (NCCL's MAXCHANNELS) */
#define POOL 2048      /* all-reduces in flight at once; past that one is dropped, and counted */
#define RING 65536     /* finished all-reduces kept until Python takes them */
#define STALE_NS 60000000000ull
#define TAG_COLL 0xC011u
#define TAG_CHAN 0xC4A7u

typedef struct coll coll;
typedef struct {
  uint32_t tag;
  coll* parent;
} chan;

struct coll {
  uint32_t tag;
  int busy;           /* 1 from its start until its last channel ended */
  uint64_t comm;      /* the communicator's hash */
  uint64_t host_ns;   /* CLOCK_MONOTONIC when NCCL started it (Python's time.monotonic) */
  uint64_t count;     /* elements */
  int channels;       /* channels NCCL runs it on */
  int ended;          /* channels ended so far */
  uint64_t first_start, last_end;
  chan ch[MAX_CH];
};

typedef struct {
  uint64_t host_ns, kernel_ns, comm, count;
} record;

typedef struct {
  uint64_t comm;
  int nranks, rank;
} context;

static coll pool[POOL];
static uint64_t next_slot;
static record ring[RING];
static uint64_t ring_head, ring_tail; /* under lock */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int* nccl_mask;         /* NCCL's activation mask, read at every collective call */
static int enabled = 1;
static int comms;
static uint64_t dropped, lost;
static context contexts[64];

static const int MASK = PROFILE_COLL | PROFILE_KERNEL_CH;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static ncclResult_t on_init(void** context_out, uint64_t commId, int* mask, const char* name,
                            int nNodes, int nranks, int rank, ncclDebugLogger_t log) {
  (void)name, (void)nNodes, (void)log;
  pthread_mutex_lock(&lock);
  context* ctx = &contexts[comms % 64];
  ctx->comm = commId, ctx->nranks = nranks, ctx->rank = rank;
  comms++;
  nccl_mask = mask;
  __atomic_store_n(mask, enabled ? MASK : 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&lock);
  *context_out = ctx;
  return 0;
}

static void publish(coll* c) {
  pthread_mutex_lock(&lock);
  if (ring_head - ring_tail < RING) {
    record* r = &ring[ring_head % RING];
    r->host_ns = c->host_ns, r->comm = c->comm, r->count = c->count;
    r->kernel_ns = c->last_end > c->first_start ? c->last_end - c->first_start : 0;
    ring_head++;
  } else {
    lost++;
  }
  pthread_mutex_unlock(&lock);
  __atomic_store_n(&c->busy, 0, __ATOMIC_RELEASE);
}

static ncclResult_t on_start(void* ctx, void** handle, descr_v5* d) {
  *handle = NULL;
  if (d->type == PROFILE_COLL) {
    if (d->coll.func == NULL || strcmp(d->coll.func, "AllReduce") != 0) return 0;
    coll* c = &pool[__atomic_fetch_add(&next_slot, 1, __ATOMIC_RELAXED) % POOL];
    uint64_t now = now_ns();
    int idle = 0;
    if (!__atomic_compare_exchange_n(&c->busy, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
      /* still running, or its kernel events never came (a minute on: taken back) */
      __atomic_fetch_add(&dropped, 1, __ATOMIC_RELAXED);
      if (now - c->host_ns < STALE_NS) return 0;
    }
    c->tag = TAG_COLL;
    c->comm = ((context*)ctx)->comm;
    c->host_ns = now;
    c->count = d->coll.count;
    c->channels = d->coll.nChannels;
    c->ended = 0;
    c->first_start = UINT64_MAX, c->last_end = 0;
    *handle = c;
  } else if (d->type == PROFILE_KERNEL_CH) {
    coll* c = (coll*)d->parentObj;
    if (c == NULL || c->tag != TAG_COLL || d->kernelCh.channelId >= MAX_CH) return 0;
    chan* ch = &c->ch[d->kernelCh.channelId];
    ch->tag = TAG_CHAN, ch->parent = c;
    if (d->kernelCh.pTimer < c->first_start) c->first_start = d->kernelCh.pTimer;
    *handle = ch;
  }
  return 0;
}

static ncclResult_t on_state(void* handle, int state, state_args_v5* args) {
  if (handle == NULL || state != STATE_KERNEL_CH_STOP || args == NULL) return 0;
  chan* ch = (chan*)handle;
  if (ch->tag != TAG_CHAN) return 0;
  coll* c = ch->parent;
  if (args->kernelCh.pTimer > c->last_end) c->last_end = args->kernelCh.pTimer;
  int ended = __atomic_add_fetch(&c->ended, 1, __ATOMIC_ACQ_REL);
  if (ended == (c->channels > 0 ? c->channels : 1)) publish(c);
  return 0;
}

static ncclResult_t on_stop(void* handle) {
  (void)handle; /* a collective's host stop comes before its kernel ends: the channels decide */
  return 0;
}

static ncclResult_t on_finalize(void* ctx) {
  (void)ctx;
  return 0;
}

__attribute__((visibility("default"))) profiler_v5 ncclProfiler_v5 = {
    "ddptop-kernel-clock", on_init, on_start, on_stop, on_state, on_finalize};

/* --- read by ddptop.rank.kernel_clock through ctypes ---------------------------------------- */

/* Finished all-reduces, oldest first: 4 numbers each (host issue ns, kernel ns, comm, count). */
__attribute__((visibility("default"))) int ddptop_nccl_take(uint64_t* out, int max) {
  int n = 0;
  pthread_mutex_lock(&lock);
  while (ring_tail < ring_head && n < max) {
    record* r = &ring[ring_tail % RING];
    out[4 * n] = r->host_ns, out[4 * n + 1] = r->kernel_ns;
    out[4 * n + 2] = r->comm, out[4 * n + 3] = r->count;
    ring_tail++, n++;
  }
  pthread_mutex_unlock(&lock);
  return n;
}

/* Kernel events on (1) or off (0) for the collectives called from now on. */
__attribute__((visibility("default"))) void ddptop_nccl_enable(int on) {
  pthread_mutex_lock(&lock);
  enabled = on != 0;
  if (nccl_mask != NULL) __atomic_store_n(nccl_mask, enabled ? MASK : 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&lock);
}

/* Communicators NCCL initialised with this plugin, and all-reduces it could not keep. */
__attribute__((visibility("default"))) int ddptop_nccl_comms(void) {
  return __atomic_load_n(&comms, __ATOMIC_RELAXED);
}

__attribute__((visibility("default"))) uint64_t ddptop_nccl_dropped(void) {
  return __atomic_load_n(&dropped, __ATOMIC_RELAXED) + __atomic_load_n(&lost, __ATOMIC_RELAXED);
}
