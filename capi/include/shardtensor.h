/* ShardTensor C API: a trained (or training) model inside an MPI simulation, from C.
 *
 * Every function returns a status (SHARDTENSOR_OK = 0 on success); on failure
 * shardtensor_last_error() gives a message naming the problem and the values. No exception
 * crosses this boundary. Calls on a session are collective over the solver's communicator:
 * every rank makes the same calls in the same order, and an error found on one rank (a null
 * pointer, say) is returned on every rank, so none is left waiting.
 *
 * Local errors, returned only on the ranks where they occur (there is nothing to agree
 * over, or the call is not collective): a NULL session handle; a NULL shardtensor_session*
 * in shardtensor_destroy; MPI_COMM_NULL in shardtensor_create; NULL output pointers of
 * shardtensor_steps and shardtensor_last_call_copied; shardtensor_initialize without MPI;
 * shardtensor_finalize while sessions exist; a NULL output of shardtensor_last_call_copy_reason.
 * Every other error (NULL patch, options, array lists or arrays, channel counts, patches that
 * do not tile, ghost widths and components that do not fit them, overlapping arrays, a NaN
 * or Inf in an input, config and checkpoint errors, a diverging loss) is returned on every
 * rank with the same message.
 *
 *   shardtensor_initialize();                       after MPI_Init
 *   shardtensor_patch patch = {3, {nx, ny, nz}, {x0, y0, z0}, {lx, ly, lz}, {0, 0, 0}};
 *   shardtensor_options options;
 *   shardtensor_options_default(&options);
 *   options.config = "model.yaml";  options.checkpoint = "trained.h5";
 *   options.array_order = SHARDTENSOR_ORDER_C;  options.ghost_width = 1;
 *   options.boundary_ghost_width = 0;               none past the edge of a non-periodic field
 *   shardtensor_session session;
 *   shardtensor_create(MPI_COMM_WORLD, &patch, &options, &session);
 *   const double* in[1] = {u};  double* out[1] = {prediction};
 *   shardtensor_infer_double(session, in, 1, out, 1);
 *   shardtensor_destroy(&session);
 *   shardtensor_finalize();                         before MPI_Finalize
 *
 * See docs/embedding.md. */
#ifndef SHARDTENSOR_H
#define SHARDTENSOR_H

#include <mpi.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
enum {
  SHARDTENSOR_OK = 0,
  SHARDTENSOR_ERROR_INVALID_ARGUMENT = 1, /* null pointer, bad patch, shape mismatch, anything
                                             shardtensor_create rejects (config errors) */
  SHARDTENSOR_ERROR_NOT_INITIALIZED = 2,  /* a call before shardtensor_initialize (or after
                                             shardtensor_finalize) */
  SHARDTENSOR_ERROR_FAILED = 3            /* anything else: I/O, a diverging loss, MPI not
                                             initialized, out of memory, ... */
};

/* Memory order of the solver's arrays. */
enum { SHARDTENSOR_ORDER_C = 0, SHARDTENSOR_ORDER_FORTRAN = 1 };

/* This rank's patch of the global field. Axes in the order the solver indexes its arrays
 * (u[x][y][z] in C, u(x, y, z) in Fortran); entries past ndims are ignored. */
typedef struct {
  int ndims;                /* 1 to 3 */
  int64_t global_extent[3]; /* cells of the whole field per axis */
  int64_t offset[3];        /* first cell this rank owns, per axis (0-based) */
  int64_t extent[3];        /* cells this rank owns, per axis */
  int periodic[3];          /* nonzero: the axis is periodic */
} shardtensor_patch;

/* How the session reads the solver's arrays and which model it runs. Fill with
 * shardtensor_options_default, then set what differs. Every array (inputs, targets, outputs)
 * holds this rank's patch plus ghost cells, in array_order, with `components` values per cell.
 *
 * Ghost cells: either ghost_width on every side that faces another rank's patch (a periodic
 * wrap included) and boundary_ghost_width past the field's edge on non-periodic axes (0 for
 * PETSc's DMDA; the same as ghost_width where the solver keeps cells there for its boundary
 * conditions; it must be said when ghost_width > 0 and an axis is not periodic), or this
 * rank's exact widths in ghost_lower / ghost_upper (all ndims entries of both >= 0; -1: not
 * given). A ghost layer facing a patch must lie within that patch.
 *
 * components > 1: the arrays interleave that many values per cell, the component fastest
 * (PETSc's dof: u[y][x][c] in C, u(c, x, y) in Fortran); pass each channel as a pointer to
 * its component (u + c). */
typedef struct {
  const char* config;      /* run config file (YAML), or NULL */
  const char* config_text; /* or the config itself, or NULL */
  const char* checkpoint;  /* parameters to start from, or NULL; alone it also gives the config */
  int64_t input_channels;  /* arrays per input (default 1) */
  int64_t output_channels; /* arrays per output (default 1) */
  int array_order;         /* SHARDTENSOR_ORDER_C (default) or SHARDTENSOR_ORDER_FORTRAN */
  int64_t ghost_width;     /* ghost cells on each side facing a patch (default 0) */
  int64_t boundary_ghost_width; /* ghost cells past the field's edge (default -1: not said) */
  int64_t ghost_lower[3];  /* this rank's exact widths per axis, or -1 (default) */
  int64_t ghost_upper[3];
  int64_t components;      /* values per cell, the component fastest (default 1) */
  const char* const* overrides; /* noverrides "key=value" config overrides (like --set), or NULL */
  int noverrides;
} shardtensor_options;

typedef struct shardtensor_session_s* shardtensor_session;

/* Initializes the library (Kokkos, unless the program already did) once MPI is initialized;
 * finalize after destroying every session and before MPI_Finalize (it finalizes Kokkos only
 * if initialize started it; Kokkos cannot be started again after that). Both are
 * idempotent. Call them from one thread. */
int shardtensor_initialize(void);
int shardtensor_finalize(void);

/* The message of the last failed call on this thread ("" if none): the function, the problem
 * and the values. Valid until the next failed call on this thread. */
const char* shardtensor_last_error(void);

void shardtensor_options_default(shardtensor_options* options);

/* Creates a session on the solver's communicator (duplicated) and patch. Collective. */
int shardtensor_create(MPI_Comm comm, const shardtensor_patch* patch,
                       const shardtensor_options* options, shardtensor_session* session);
/* The same with a Fortran MPI handle (MPI_Fint), converted with MPI_Comm_f2c. */
int shardtensor_create_f(MPI_Fint comm, const shardtensor_patch* patch,
                         const shardtensor_options* options, shardtensor_session* session);
/* Frees the session and sets *session to NULL (a NULL *session is fine). Collective. */
int shardtensor_destroy(shardtensor_session* session);

/* Runs the model on `inputs` (ninputs = input_channels arrays) into `outputs`
 * (noutputs = output_channels arrays): only owned cells of the outputs are written. */
int shardtensor_infer_double(shardtensor_session session, const double* const* inputs,
                             int ninputs, double* const* outputs, int noutputs);
int shardtensor_infer_float(shardtensor_session session, const float* const* inputs, int ninputs,
                            float* const* outputs, int noutputs);

/* One optimizer step on an input/target pair; *loss (may be NULL) receives the loss. */
int shardtensor_train_step_double(shardtensor_session session, const double* const* inputs,
                                  int ninputs, const double* const* targets, int ntargets,
                                  double* loss);
int shardtensor_train_step_float(shardtensor_session session, const float* const* inputs,
                                 int ninputs, const float* const* targets, int ntargets,
                                 double* loss);

/* Checkpoints that `shardtensor infer` and other sessions load on any rank count. */
int shardtensor_save_checkpoint(shardtensor_session session, const char* path);
int shardtensor_load_checkpoint(shardtensor_session session, const char* path);

/* *copied = 1 if the last infer/train_step copied the inputs, 0 if it read them in place. */
int shardtensor_last_call_copied(shardtensor_session session, int* copied);
/* *reason = why the last infer/train_step copied the inputs ("" if it read them in place):
 * precision, array order, interleaved components, ghost widths, normalisation, a GPU.
 * Valid until the session's next call. */
int shardtensor_last_call_copy_reason(shardtensor_session session, const char** reason);
/* Optimizer steps taken (including a loaded checkpoint's). */
int shardtensor_steps(shardtensor_session session, int64_t* steps);

#ifdef __cplusplus
}
#endif

#endif /* SHARDTENSOR_H */
