// The only boundary between the C++ adapter and the Rust core.
//
// The adapter marshals operator arguments into these plain structs; the core
// owns every operator's semantics. Every function returns 0 on success or an
// error kind (TT_ERR_*); the message is then read with tt_last_error().
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Error kinds, mapped by the adapter onto PyTorch's exception types.
enum {
  TT_OK = 0,
  TT_ERR_RUNTIME = 1,         // RuntimeError
  TT_ERR_VALUE = 2,           // ValueError
  TT_ERR_INDEX = 3,           // IndexError
  TT_ERR_TYPE = 4,            // TypeError
  TT_ERR_NOT_IMPLEMENTED = 5, // NotImplementedError
  TT_ERR_LINALG = 6,          // torch.linalg.LinAlgError
  TT_FALLBACK = 7,            // not an error: run this call on the CPU
  TT_GRAPH_MISS = 8,          // not an error: the compiled graph has no plan for this signature yet
  TT_ERR_OUT_OF_MEMORY = 9,   // torch.OutOfMemoryError
};

// A tensor argument: a tpu view of a Rust storage, or a CPU tensor (scalars
// and host-side copies).
typedef struct TtTensor {
  void* storage;        // Rust storage handle (tpu); NULL for CPU tensors
  const void* host;     // CPU tensors: address of element 0 of the view
  const int64_t* sizes;
  const int64_t* strides;
  int64_t offset;       // storage offset, in elements
  int32_t ndim;
  int32_t dtype;        // c10::ScalarType
  int32_t device;       // tpu device index, -1 for CPU
  uint8_t wrapped_number;
  uint8_t defined;      // 0 for an undefined optional tensor in a list
} TtTensor;

enum {
  TT_ARG_NONE = 0,
  TT_ARG_TENSOR = 1,      // tensors[0]
  TT_ARG_TENSOR_LIST = 2, // tensors[0..len)
  TT_ARG_INT = 3,         // i
  TT_ARG_FLOAT = 4,       // f
  TT_ARG_BOOL = 5,        // i
  TT_ARG_INT_LIST = 6,    // ints[0..len)
  TT_ARG_FLOAT_LIST = 7,  // floats[0..len)
  TT_ARG_BOOL_LIST = 8,   // ints[0..len)
  TT_ARG_STRING = 9,      // str
  TT_ARG_SEED = 10,       // i: 64 random bits drawn from the tpu generator
  TT_ARG_OTHER = 11,      // device and other values no lowering reads
  TT_ARG_COMPLEX = 12,    // f + imag i
};

typedef struct TtArg {
  int32_t kind;
  int64_t i;
  double f;
  const TtTensor* tensors;
  const int64_t* ints;
  const double* floats;
  int64_t len;
  const char* str;
  double imag;
} TtArg;

// Declared argument of an operator's schema, given once when the operator is
// first seen. `type` is the schema type string ("Tensor", "Scalar", "int[]").
typedef struct TtSchemaArg {
  const char* name;
  const char* type;
  uint8_t is_out;      // keyword-only written argument of an out= overload
  // A tensor the op mutates other than out= and an in-place self
  // (`Tensor(a!) running_mean`). Set by the adapter from the schema; the core
  // sets it too where an op mutates an argument its schema does not mark
  // (native_batch_norm's running stats). Such arguments receive the op's last
  // results, one per defined argument, in schema order.
  uint8_t is_written;
} TtSchemaArg;

// A fresh tpu tensor produced by the core: contiguous, owning a new storage;
// storage NULL for an undefined tensor (a gradient an output_mask leaves out).
typedef struct TtResult {
  void* storage;
  uint64_t addr;
  int64_t nbytes;
  const int64_t* sizes;
  const int64_t* strides;  // null: contiguous
  int32_t ndim;
  int32_t dtype;
  int32_t device;
} TtResult;

const char* tt_last_error(void);

// Storage lifetime (allocator and DataPtr deleter).
int tt_storage_new(int64_t nbytes, int32_t device, void** storage, uint64_t* addr);
void tt_storage_release(void* storage);
// A new storage of nbytes holding the old one's contents (the rest unset):
// resizing moves a storage to a new, non-overlapping address range.
int tt_storage_resize(void* old_storage, int64_t nbytes, void** storage, uint64_t* addr);

// Makes dst's storage hold src's value (whole, same bytes): out= and in-place
// results land without a copy.
int tt_storage_assign(void* dst, void* src);

// Operators. tt_op_register returns op >= 0 when the core lowers it, -1 when
// it must run through the CPU fallback; it may set args[i].is_written.
int tt_op_register(const char* name, const char* overload, TtSchemaArg* args,
                   int64_t nargs, int32_t* op);
// Whether the op's lowering checks what PyTorch's meta function checks (its
// structured functional and in-place forms then skip the meta function).
bool tt_op_checks_meta(int32_t op);
// Runs a functional operator; results stay valid until the next call on the
// same thread.
int tt_op_run(int32_t op, const TtArg* args, int64_t nargs, const TtResult** results,
              int64_t* nresults);
// Counts a CPU fallback of `name` and runs the pending fused trace first.
int tt_fallback(const char* name);

// Copies between views: tpu->tpu (broadcast and dtype conversion included),
// host->tpu (src.host is contiguous in dst's dtype and shape), tpu->host (dst.host
// is contiguous in src's dtype and shape).
int tt_copy(const TtTensor* src, const TtTensor* dst);

// Compiled graphs (torch.compile). A call's arguments are the graph's
// tensors, then its numbers. Its results are new storages (owned by the
// caller, as tt_op_run's) and views: of new storage `source` when source >= 0,
// else of tensor argument -1 - source's storage (an output aliasing an input).
typedef struct TtView {
  int64_t source;
  const int64_t* sizes;
  const int64_t* strides;
  int64_t offset;
  int32_t ndim;
  int32_t dtype;
} TtView;
typedef struct TtGraphResults {
  const TtResult* storages;  // storage, addr, nbytes, device
  int64_t nstorages;
  const TtView* views;
  int64_t nviews;
} TtGraphResults;
// Runs graph `graph` (results valid until the next graph call on this thread).
int tt_graph_call(int64_t graph, const TtArg* args, int64_t nargs, TtGraphResults* out);
// Starts capturing it for these arguments' signature: the results are the
// placeholders (one view per tensor argument) to run the graph's ops on.
int tt_capture_begin(int64_t graph, const TtArg* args, int64_t nargs, TtGraphResults* out);
// Ends the capture with the graph's tensor outputs, computed on placeholders.
int tt_capture_end(const TtTensor* outputs, int64_t n);
// The end of an optimizer step: fused mode flushes (a graph being captured
// is marked to flush after each of its calls).
int tt_step_end(void);

// torch.distributed's collective `kind` (see distributed/collective.rs) over the group's
// devices (global ids, rank order): inputs[i] and outputs[i] are on the i-th
// local one; `pairs` are permute's (source, target) ranks, flattened.
int tt_collective(const char* kind, const char* op, double scale, int64_t root, const int64_t* pairs,
                  int64_t npairs, const int64_t* devices, int64_t ndevices, const TtTensor* inputs,
                  const TtTensor* outputs, int64_t n);

// The host address of the tensor's elements for gloo to work on in place, or
// 0; access: "read_write", "read" or "write" (see distributed/collective.rs: host_alias).
int tt_host_alias(const TtTensor* tensor, const char* access, uint64_t* address);

int tt_device_count(int32_t* count);
int tt_synchronize(int32_t device);

// Memory: statistics of the bytes live device buffers hold (c10's Stat
// layout), the device's free and total bytes, and host memory registered
// for transfers (pin_memory).
typedef struct TtStat {
  int64_t current, peak, allocated, freed;
} TtStat;
typedef struct TtMemoryStats {
  TtStat buffers;   // count of live device buffers
  TtStat bytes;     // bytes they hold
  TtStat reserved;  // bytes the device's allocator reserves
} TtMemoryStats;
int tt_memory_stats(int32_t device, TtMemoryStats* stats);
void tt_memory_reset_peak(int32_t device);
void tt_memory_reset_accumulated(int32_t device);
int tt_memory_info(int32_t device, int64_t* free_bytes, int64_t* total_bytes);
int tt_host_pin(void* data, size_t size);
int tt_host_unpin(void* data);

// Events: every stream maps onto the device's one in-order queue, so an event
// marks all work issued before it (fused mode's recorded ops are issued).
int tt_event_record(uint8_t timing, void** event);
void tt_event_destroy(void* event);
uint8_t tt_event_query(void* event);
int tt_event_synchronize(void* event);
int tt_event_elapsed_ms(void* start, void* end, double* ms);
// Whether all work issued so far is done.
int tt_idle(uint8_t* idle);

// Implemented by the adapter: 64 random bits from the default tpu generator of
// a device (ops that draw random numbers without a generator argument).
uint64_t tt_adapter_default_seed(int32_t device);
// tpu:`device`'s default generator as a Python torch.Generator (a new
// reference), or null with a Python error set. Called with the GIL held.
void* tt_default_generator(int32_t device);

// Implemented by the adapter (precision.cpp): PyTorch's float32 matmul
// setting, as the precision float32 dots and convolutions carry.
enum {
  TT_PRECISION_DEFAULT = 0,  // "medium": one bfloat16 pass on a TPU
  TT_PRECISION_HIGH = 1,     // "high": TF32, or three bfloat16 passes
  TT_PRECISION_HIGHEST = 2,  // "highest": full float32
};
int32_t tt_adapter_f32_precision(void);

// Implemented by the adapter (kernel.cpp): custom kernels' fast path from
// Python. A table per decorated kernel maps call signatures to lowered kernels
// of one output; `args` is the call's Python tuple (the GIL held).
int64_t tt_kernel_table_new(void);
// Records that calls with the signature of `args` run lowered kernel `kernel`.
void tt_kernel_table_put(int64_t table, void* args, int64_t kernel);
// The output (a new reference) of a call with `args`; NULL with no Python
// error set when no recorded signature matches, NULL with one set on failure.
void* tt_kernel_table_call(int64_t table, void* args);

// Implemented by the adapter (store.cpp): a torch.distributed Store (c10d),
// through which the processes of a multi-process PJRT client meet. Adopting
// takes a reference to the Python object's store (the GIL held), or returns
// NULL if it is not one; the other calls need no GIL.
void* tt_store_adopt(void* store_object);
void tt_store_release(void* store);
enum {
  TT_STORE_MISSING = 1,  // try_get: no such key
  TT_STORE_TIMEOUT = 2,  // get: none put within the timeout
  TT_STORE_FAILED = 3,
};
// Each returns 0 or a TT_STORE_* code; `*bytes` then holds the value, or the
// error's message, freed by tt_store_free.
int32_t tt_store_get(void* store, const char* key, size_t key_size, int64_t timeout_ms, char** bytes,
                     size_t* size);
int32_t tt_store_try_get(void* store, const char* key, size_t key_size, char** bytes, size_t* size);
int32_t tt_store_put(void* store, const char* key, size_t key_size, const char* value, size_t value_size,
                     char** bytes, size_t* size);
void tt_store_free(char* bytes);

#ifdef __cplusplus
}
#endif
