/* The C API from C: a session on a solver's C-order arrays with ghost cells computes what one
 * rank computes on the whole field; online training gives the same loss on every rank;
 * checkpoints load into a session on another rank count; bad input fails with an error code
 * and a message on every rank (no rank hangs); where the suite exported its ONNX networks
 * ($SHARDTENSOR_ONNX_MODELS), a session with model: {type: onnx} predicts PyTorch's output
 * and trains as one rank does. Run at 1, 2 and 4 ranks. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shardtensor.h"

static int rank = 0, nranks = 1, failures = 0;

#define CHECK(condition)                                                           \
  do {                                                                             \
    if (!(condition)) {                                                            \
      ++failures;                                                                  \
      fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed\n", rank, __FILE__, __LINE__, \
              #condition);                                                         \
    }                                                                              \
  } while (0)

/* Every rank got `expected` from a call, and the last error names `text`. */
#define CHECK_ERROR_EVERYWHERE(status, expected, text)                                  \
  do {                                                                                  \
    const int failed_here = (status) == (expected);                                     \
    int failed_ranks = 0;                                                               \
    MPI_Allreduce(&failed_here, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);    \
    CHECK(failed_ranks == nranks);                                                      \
    if (strstr(shardtensor_last_error(), (text)) == NULL) {                             \
      ++failures;                                                                       \
      fprintf(stderr, "rank %d: %s:%d: expected \"%s\" in the message \"%s\"\n", rank,  \
              __FILE__, __LINE__, (text), shardtensor_last_error());                    \
    }                                                                                   \
  } while (0)

/* The field: 10 x 12 x 6 cells, two input channels, one output channel. */
enum { GX = 10, GY = 12, GZ = 6, GHOST = 1 };
static const int64_t global_extent[3] = {GX, GY, GZ};

static const char* model_config =
    "model: {type: unet, depth: 1, base_channels: 4, norm: group, norm_groups: 2,"
    " activation: gelu, input_skip: true, seed: 11}\n"
    "optimizer: {type: adam, lr: 0.01}\n"
    "training: {precision: double, loss: mse, clip_grad_norm: 2.0}\n"
    "data: {normalize: false}\n";

/* A smooth-ish, never zero value of (seed, channel, global cell). */
static double value_at(int seed, int channel, int64_t x, int64_t y, int64_t z) {
  return sin(0.7 * x + 1.3 * y + 0.4 * z + seed) + 0.3 * cos(1.1 * x * y + 0.5 * z) +
         0.5 * channel + 0.01 * seed;
}

/* One rank's arrays: `channels` C-order arrays of the patch plus `ghost` cells per side,
 * one after another in one allocation; ghost cells hold `fill`. */
typedef struct {
  shardtensor_patch patch;
  int64_t ghost, allocated[3], size; /* size: values per channel */
  int channels;
  double* data;
} field;

static field field_new(const shardtensor_patch* patch, int64_t ghost, int channels, double fill) {
  field f;
  f.patch = *patch;
  f.ghost = ghost;
  f.channels = channels;
  f.size = 1;
  for (int a = 0; a < 3; ++a) f.size *= (f.allocated[a] = patch->extent[a] + 2 * ghost);
  f.data = malloc(sizeof(double) * (size_t)(f.size * channels));
  for (int64_t i = 0; i < f.size * channels; ++i) f.data[i] = fill;
  return f;
}

static int64_t field_index(const field* f, int64_t i, int64_t j, int64_t k) {
  return ((i + f->ghost) * f->allocated[1] + (j + f->ghost)) * f->allocated[2] + (k + f->ghost);
}

static void field_fill(field* f, int seed) {
  for (int c = 0; c < f->channels; ++c)
    for (int64_t i = 0; i < f->patch.extent[0]; ++i)
      for (int64_t j = 0; j < f->patch.extent[1]; ++j)
        for (int64_t k = 0; k < f->patch.extent[2]; ++k)
          f->data[c * f->size + field_index(f, i, j, k)] =
              value_at(seed, c, f->patch.offset[0] + i, f->patch.offset[1] + j,
                       f->patch.offset[2] + k);
}

static double* channel(field* f, int c) { return f->data + c * f->size; }

/* max |sharded - whole| / max |whole| over the owned cells of every rank. */
static double relative_difference(field* sharded, field* whole) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < sharded->patch.extent[0]; ++i)
    for (int64_t j = 0; j < sharded->patch.extent[1]; ++j)
      for (int64_t k = 0; k < sharded->patch.extent[2]; ++k) {
        const double a = sharded->data[field_index(sharded, i, j, k)];
        const double b = whole->data[field_index(whole, sharded->patch.offset[0] + i,
                                                 sharded->patch.offset[1] + j,
                                                 sharded->patch.offset[2] + k)];
        diff = fmax(diff, fabs(a - b));
        scale = fmax(scale, fabs(b));
      }
  MPI_Allreduce(MPI_IN_PLACE, &diff, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &scale, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return diff / scale;
}

/* This rank's patch of a field of `extent` cells on a balanced process grid (MPI_Dims_create),
 * or the whole field (`whole`). */
static shardtensor_patch patch_of(const int64_t extent[3], int whole) {
  int dims[3] = {0, 0, 0};
  MPI_Dims_create(whole ? 1 : nranks, 3, dims);
  const int r = whole ? 0 : rank;
  const int coords[3] = {r / (dims[1] * dims[2]), (r / dims[2]) % dims[1], r % dims[2]};
  shardtensor_patch p;
  memset(&p, 0, sizeof p);
  p.ndims = 3;
  for (int a = 0; a < 3; ++a) {
    p.global_extent[a] = extent[a];
    p.offset[a] = extent[a] * coords[a] / dims[a];
    p.extent[a] = extent[a] * (coords[a] + 1) / dims[a] - p.offset[a];
  }
  return p;
}

static shardtensor_patch my_patch(void) { return patch_of(global_extent, 0); }
static shardtensor_patch whole_patch(void) { return patch_of(global_extent, 1); }

static shardtensor_options model_options(int64_t ghost) {
  shardtensor_options o;
  shardtensor_options_default(&o);
  o.config_text = model_config;
  o.input_channels = 2;
  o.output_channels = 1;
  o.array_order = SHARDTENSOR_ORDER_C;
  o.ghost_width = ghost;
  o.boundary_ghost_width = ghost; /* the arrays keep ghost cells past the field's edge too */
  return o;
}

static void test_before_initialize(void) {
  shardtensor_session session = NULL;
  const shardtensor_patch patch = my_patch();
  const shardtensor_options options = model_options(GHOST);
  CHECK(shardtensor_create(MPI_COMM_WORLD, &patch, &options, &session) ==
        SHARDTENSOR_ERROR_NOT_INITIALIZED);
  CHECK(strstr(shardtensor_last_error(), "shardtensor_initialize") != NULL);
  CHECK(session == NULL);
  int64_t steps = 0;
  CHECK(shardtensor_steps(NULL, &steps) == SHARDTENSOR_ERROR_NOT_INITIALIZED);
  CHECK(strstr(shardtensor_last_error(), "shardtensor_steps: the library is not initialized") !=
        NULL);
}

/* infer and train_step against one rank on the whole field; checkpoints; returns the path. */
static void test_session(const char* checkpoint_path) {
  const shardtensor_patch patch = my_patch(), whole = whole_patch();
  const shardtensor_options options = model_options(GHOST), whole_options = model_options(0);
  shardtensor_session session = NULL, single = NULL;
  CHECK(shardtensor_create(MPI_COMM_WORLD, &patch, &options, &session) == SHARDTENSOR_OK);
  CHECK(shardtensor_create(MPI_COMM_SELF, &whole, &whole_options, &single) == SHARDTENSOR_OK);
  if (session == NULL || single == NULL) {
    fprintf(stderr, "rank %d: create failed: %s\n", rank, shardtensor_last_error());
    return;
  }

  /* infer: sharded with ghost cells == one rank, whole field, no ghosts. */
  field x = field_new(&patch, GHOST, 2, 7777.0), y = field_new(&patch, GHOST, 1, 4242.0);
  field wx = field_new(&whole, 0, 2, 0.0), wy = field_new(&whole, 0, 1, 0.0);
  field_fill(&x, 3);
  field_fill(&wx, 3);
  const double* in[2] = {channel(&x, 0), channel(&x, 1)};
  double* out[1] = {channel(&y, 0)};
  const double* whole_in[2] = {channel(&wx, 0), channel(&wx, 1)};
  double* whole_out[1] = {channel(&wy, 0)};
  CHECK(shardtensor_infer_double(session, in, 2, out, 1) == SHARDTENSOR_OK);
  CHECK(shardtensor_infer_double(single, whole_in, 2, whole_out, 1) == SHARDTENSOR_OK);
  const double difference = relative_difference(&y, &wy);
  if (rank == 0) printf("infer: sharded vs one rank, relative difference %.3e\n", difference);
  CHECK(difference <= 1e-12);
  int copied = -1;
  CHECK(shardtensor_last_call_copied(session, &copied) == SHARDTENSOR_OK);
  const char* reason = NULL;
  CHECK(shardtensor_last_call_copy_reason(session, &reason) == SHARDTENSOR_OK && reason != NULL);
#ifdef SHARDTENSOR_TEST_ARRAYS_COPIED
  CHECK(copied == 1); /* the model computes on a GPU: the host arrays are copied to it */
  CHECK(reason != NULL && strstr(reason, "GPU") != NULL);
#else
  CHECK(copied == 0); /* double, C order, channels adjacent, no normalisation: in place */
  CHECK(reason != NULL && reason[0] == '\0');
#endif
  int64_t kept = 0; /* output ghost cells keep the solver's values */
  for (int64_t v = 0; v < y.size; ++v) kept += y.data[v] == 4242.0;
  CHECK(kept == y.size - patch.extent[0] * patch.extent[1] * patch.extent[2]);

  /* train_step: the same loss on every rank, equal to one rank's. */
  for (int step = 0; step < 2; ++step) {
    field t = field_new(&patch, GHOST, 1, -5.0), wt = field_new(&whole, 0, 1, 0.0);
    field_fill(&x, 10 + step);
    field_fill(&wx, 10 + step);
    field_fill(&t, 20 + step);
    field_fill(&wt, 20 + step);
    const double* target[1] = {channel(&t, 0)};
    const double* whole_target[1] = {channel(&wt, 0)};
    double loss = -1, reference = -2, lowest, highest;
    CHECK(shardtensor_train_step_double(session, in, 2, target, 1, &loss) == SHARDTENSOR_OK);
    CHECK(shardtensor_train_step_double(single, whole_in, 2, whole_target, 1, &reference) ==
          SHARDTENSOR_OK);
    MPI_Allreduce(&loss, &lowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&loss, &highest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("train_step %d: loss %.12g (one rank %.12g)\n", step, loss, reference);
    CHECK(lowest == highest);
    CHECK(fabs(loss - reference) <= 1e-10 * fabs(reference));
    free(t.data);
    free(wt.data);
  }
  int64_t steps = 0;
  CHECK(shardtensor_steps(session, &steps) == SHARDTENSOR_OK && steps == 2);

  /* A checkpoint of the sharded session, loaded into a new one-rank session: same
   * predictions. The loss may also be NULL. */
  CHECK(shardtensor_save_checkpoint(session, checkpoint_path) == SHARDTENSOR_OK);
  shardtensor_session reloaded = NULL;
  CHECK(shardtensor_create(MPI_COMM_SELF, &whole, &whole_options, &reloaded) == SHARDTENSOR_OK);
  CHECK(shardtensor_load_checkpoint(reloaded, checkpoint_path) == SHARDTENSOR_OK);
  CHECK(shardtensor_steps(reloaded, &steps) == SHARDTENSOR_OK && steps == 2);
  field_fill(&x, 30);
  field_fill(&wx, 30);
  CHECK(shardtensor_infer_double(session, in, 2, out, 1) == SHARDTENSOR_OK);
  CHECK(shardtensor_infer_double(reloaded, whole_in, 2, whole_out, 1) == SHARDTENSOR_OK);
  CHECK(relative_difference(&y, &wy) <= 1e-12);
  /* A session from the checkpoint alone (its stored config). */
  shardtensor_options from_file;
  shardtensor_options_default(&from_file);
  from_file.checkpoint = checkpoint_path;
  from_file.input_channels = 2;
  from_file.ghost_width = from_file.boundary_ghost_width = GHOST;
  shardtensor_session restarted = NULL;
  CHECK(shardtensor_create(MPI_COMM_WORLD, &patch, &from_file, &restarted) == SHARDTENSOR_OK);
  field y2 = field_new(&patch, GHOST, 1, 0.0);
  double* out2[1] = {channel(&y2, 0)};
  CHECK(shardtensor_infer_double(restarted, in, 2, out2, 1) == SHARDTENSOR_OK);
  CHECK(relative_difference(&y2, &wy) <= 1e-12);
  CHECK(shardtensor_train_step_double(restarted, in, 2, (const double* const*)out2, 1, NULL) ==
        SHARDTENSOR_OK);

  /* Config overrides, as `--set` gives them: a float model reads double arrays by a copy. */
  shardtensor_options overridden_options = options;
  const char* overrides[2] = {"training.precision=float", "optimizer.lr=0.002"};
  overridden_options.overrides = overrides;
  overridden_options.noverrides = 2;
  shardtensor_session overridden = NULL;
  CHECK(shardtensor_create(MPI_COMM_WORLD, &patch, &overridden_options, &overridden) ==
        SHARDTENSOR_OK);
  CHECK(shardtensor_infer_double(overridden, in, 2, out2, 1) == SHARDTENSOR_OK);
  CHECK(relative_difference(&y2, &wy) > 1e-12); /* the checkpoint's weights are not loaded */
  CHECK(shardtensor_last_call_copy_reason(overridden, &reason) == SHARDTENSOR_OK);
#ifndef SHARDTENSOR_TEST_ARRAYS_COPIED
  CHECK(reason != NULL && strstr(reason, "the model computes in float") != NULL);
#endif
  CHECK(shardtensor_destroy(&overridden) == SHARDTENSOR_OK);

  /* shardtensor_finalize refuses while sessions exist. */
  CHECK(shardtensor_finalize() == SHARDTENSOR_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(shardtensor_last_error(), "still exist") != NULL);

  CHECK(shardtensor_destroy(&restarted) == SHARDTENSOR_OK && restarted == NULL);
  CHECK(shardtensor_destroy(&reloaded) == SHARDTENSOR_OK);
  CHECK(shardtensor_destroy(&single) == SHARDTENSOR_OK);
  CHECK(shardtensor_destroy(&session) == SHARDTENSOR_OK && session == NULL);
  CHECK(shardtensor_destroy(&session) == SHARDTENSOR_OK); /* NULL: nothing to do */
  free(x.data);
  free(y.data);
  free(y2.data);
  free(wx.data);
  free(wy.data);
}

static void test_bad_input(void) {
  const shardtensor_patch patch = my_patch();
  const shardtensor_options options = model_options(GHOST);
  shardtensor_session session = NULL;
  CHECK(shardtensor_create(MPI_COMM_WORLD, &patch, &options, &session) == SHARDTENSOR_OK);
  field x = field_new(&patch, GHOST, 2, 0.0), y = field_new(&patch, GHOST, 1, 0.0);
  field_fill(&x, 1);
  const double* in[2] = {channel(&x, 0), channel(&x, 1)};
  double* out[1] = {channel(&y, 0)};
  const double* target[1] = {channel(&y, 0)};
  const int last = nranks - 1;

  /* A NULL session (here on every rank: it is a local error). */
  CHECK_ERROR_EVERYWHERE(shardtensor_infer_double(NULL, in, 2, out, 1),
                         SHARDTENSOR_ERROR_INVALID_ARGUMENT,
                         "shardtensor_infer_double: the session is NULL");

  /* A NULL patch, options or handle address on one rank only. */
  shardtensor_session other = NULL;
  CHECK_ERROR_EVERYWHERE(
      shardtensor_create(MPI_COMM_WORLD, rank == last ? NULL : &patch, &options, &other),
      SHARDTENSOR_ERROR_INVALID_ARGUMENT, "shardtensor_create: patch is NULL");
  CHECK(other == NULL);
  CHECK_ERROR_EVERYWHERE(
      shardtensor_create(MPI_COMM_WORLD, &patch, rank == last ? NULL : &options, &other),
      SHARDTENSOR_ERROR_INVALID_ARGUMENT, "options is NULL");
  CHECK_ERROR_EVERYWHERE(
      shardtensor_create(MPI_COMM_WORLD, &patch, &options, rank == 0 ? NULL : &other),
      SHARDTENSOR_ERROR_INVALID_ARGUMENT, "session is NULL");
  shardtensor_patch four_axes = patch;
  if (rank == last) four_axes.ndims = 4;
  CHECK_ERROR_EVERYWHERE(shardtensor_create(MPI_COMM_WORLD, &four_axes, &options, &other),
                         SHARDTENSOR_ERROR_INVALID_ARGUMENT, "patch->ndims is 4");

  /* Patches that do not tile the field: rank 0 leaves a cell out. */
  shardtensor_patch gap = patch;
  if (rank == 0) gap.extent[2] -= 1;
  CHECK_ERROR_EVERYWHERE(shardtensor_create(MPI_COMM_WORLD, &gap, &options, &other),
                         SHARDTENSOR_ERROR_INVALID_ARGUMENT, "cells are missing");
  CHECK(other == NULL);

  /* Wrong channel counts (on one rank, and on all). */
  CHECK_ERROR_EVERYWHERE(shardtensor_infer_double(session, in, rank == last ? 1 : 2, out, 1),
                         SHARDTENSOR_ERROR_INVALID_ARGUMENT,
                         "ninputs is 1, the session's model has 2 input channel(s)");
  CHECK_ERROR_EVERYWHERE(shardtensor_train_step_double(session, in, 2, in, 2, NULL),
                         SHARDTENSOR_ERROR_INVALID_ARGUMENT,
                         "ntargets is 2, the session's model has 1 output channel(s)");
  CHECK_ERROR_EVERYWHERE(shardtensor_infer_double(session, in, 2, NULL, 1),
                         SHARDTENSOR_ERROR_INVALID_ARGUMENT, "outputs is NULL");

  /* A NULL array on one rank only. */
  const double* one_null[2] = {in[0], rank == last ? NULL : in[1]};
  CHECK_ERROR_EVERYWHERE(shardtensor_infer_double(session, one_null, 2, out, 1),
                         SHARDTENSOR_ERROR_INVALID_ARGUMENT, "inputs[1] is NULL");
  const double* null_target[1] = {rank == 0 ? NULL : target[0]};
  CHECK_ERROR_EVERYWHERE(shardtensor_train_step_double(session, in, 2, null_target, 1, NULL),
                         SHARDTENSOR_ERROR_INVALID_ARGUMENT, "targets[0] is NULL");
  /* A NULL checkpoint path; a checkpoint that does not exist. */
  CHECK_ERROR_EVERYWHERE(shardtensor_save_checkpoint(session, rank == last ? NULL : "x.h5"),
                         SHARDTENSOR_ERROR_INVALID_ARGUMENT, "path is NULL");
  CHECK_ERROR_EVERYWHERE(shardtensor_load_checkpoint(session, "no/such/checkpoint.h5"),
                         SHARDTENSOR_ERROR_FAILED, "no/such/checkpoint.h5");
  /* An unknown config key names the key. */
  shardtensor_options typo = options;
  typo.config_text = "model: {type: unet, depht: 1}\n";
  CHECK_ERROR_EVERYWHERE(shardtensor_create(MPI_COMM_WORLD, &patch, &typo, &other),
                         SHARDTENSOR_ERROR_INVALID_ARGUMENT, "depht");

  /* The session still works after all that. */
  CHECK(shardtensor_infer_double(session, in, 2, out, 1) == SHARDTENSOR_OK);
  CHECK(shardtensor_destroy(&session) == SHARDTENSOR_OK);
  CHECK_ERROR_EVERYWHERE(shardtensor_destroy(NULL), SHARDTENSOR_ERROR_INVALID_ARGUMENT,
                         "shardtensor_destroy: session is NULL");
  free(x.data);
  free(y.data);
}

/* A PyTorch network exported to ONNX (tools/onnx_test_models.py's net3d: one input channel,
 * two output channels, 12 x 10 x 8 cells) through the C API, config type: onnx: the sharded
 * session's prediction on the exported input is PyTorch's (float32 files), equal to one rank's;
 * a training step gives one rank's loss on every rank. */
static void test_onnx_session(void) {
  const char* directory = getenv("SHARDTENSOR_ONNX_MODELS");
  if (directory == NULL) return; /* a build without ONNX: nothing exported */
  enum { NX = 12, NY = 10, NZ = 8, CELLS = NX * NY * NZ };
  char path[512], config[700];
  float input[CELLS], expected[2 * CELLS];
  snprintf(path, sizeof path, "%s/net3d.input.bin", directory);
  FILE* in_file = fopen(path, "rb");
  snprintf(path, sizeof path, "%s/net3d.output.bin", directory);
  FILE* out_file = fopen(path, "rb");
  CHECK(in_file != NULL && out_file != NULL);
  if (in_file == NULL || out_file == NULL) return;
  CHECK(fread(input, sizeof(float), CELLS, in_file) == CELLS);
  CHECK(fread(expected, sizeof(float), 2 * CELLS, out_file) == 2 * CELLS);
  fclose(in_file);
  fclose(out_file);
  snprintf(config, sizeof config,
           "model: {type: onnx, path: '%s/net3d.onnx'}\n"
           "optimizer: {type: adam, lr: 0.001}\n"
           "training: {precision: double, loss: mse}\n"
           "data: {normalize: false}\n",
           directory);

  /* A balanced split of the 12 x 10 x 8 field, no ghost cells. */
  const int64_t extent[3] = {NX, NY, NZ};
  const shardtensor_patch patch = patch_of(extent, 0), whole = patch_of(extent, 1);
  shardtensor_options options;
  shardtensor_options_default(&options);
  options.config_text = config;
  options.input_channels = 1;
  options.output_channels = 2;
  options.array_order = SHARDTENSOR_ORDER_C;
  shardtensor_session session = NULL, single = NULL;
  CHECK(shardtensor_create(MPI_COMM_WORLD, &patch, &options, &session) == SHARDTENSOR_OK);
  CHECK(shardtensor_create(MPI_COMM_SELF, &whole, &options, &single) == SHARDTENSOR_OK);
  if (session == NULL || single == NULL) {
    fprintf(stderr, "rank %d: create failed: %s\n", rank, shardtensor_last_error());
    return;
  }
  const int64_t cells = patch.extent[0] * patch.extent[1] * patch.extent[2];
  double* x = malloc(sizeof(double) * cells);
  double* y = malloc(sizeof(double) * 2 * cells);
  double* target = malloc(sizeof(double) * 2 * cells);
  double whole_x[CELLS], whole_y[2 * CELLS], whole_target[2 * CELLS];
  for (int64_t v = 0; v < CELLS; ++v) whole_x[v] = input[v];
  for (int64_t i = 0, v = 0; i < patch.extent[0]; ++i)
    for (int64_t j = 0; j < patch.extent[1]; ++j)
      for (int64_t k = 0; k < patch.extent[2]; ++k, ++v)
        x[v] = input[((patch.offset[0] + i) * NY + patch.offset[1] + j) * NZ + patch.offset[2] + k];
  const double* in[1] = {x};
  double* out[2] = {y, y + cells};
  const double* whole_in[1] = {whole_x};
  double* whole_out[2] = {whole_y, whole_y + CELLS};
  CHECK(shardtensor_infer_double(session, in, 1, out, 2) == SHARDTENSOR_OK);
  CHECK(shardtensor_infer_double(single, whole_in, 1, whole_out, 2) == SHARDTENSOR_OK);
  double to_pytorch = 0, to_single = 0, scale = 0;
  for (int c = 0; c < 2; ++c)
    for (int64_t i = 0, v = 0; i < patch.extent[0]; ++i)
      for (int64_t j = 0; j < patch.extent[1]; ++j)
        for (int64_t k = 0; k < patch.extent[2]; ++k, ++v) {
          const int64_t g = ((patch.offset[0] + i) * NY + patch.offset[1] + j) * NZ + patch.offset[2] + k;
          to_pytorch = fmax(to_pytorch, fabs(out[c][v] - expected[c * CELLS + g]));
          to_single = fmax(to_single, fabs(out[c][v] - whole_out[c][g]));
          scale = fmax(scale, fabs(expected[c * CELLS + g]));
        }
  MPI_Allreduce(MPI_IN_PLACE, &to_pytorch, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &to_single, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &scale, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    printf("onnx: sharded vs PyTorch %.3e, vs one rank %.3e (of the largest)\n",
           to_pytorch / scale, to_single / scale);
  CHECK(to_pytorch <= 1e-5 * scale);
  CHECK(to_single <= 1e-12 * scale);

  /* A training step toward a target: the same loss everywhere, one rank's. */
  for (int64_t v = 0; v < 2 * cells; ++v) target[v] = 0.5 * y[v] + 0.1;
  for (int64_t v = 0; v < 2 * CELLS; ++v) whole_target[v] = 0.5 * whole_y[v] + 0.1;
  const double* targets[2] = {target, target + cells};
  const double* whole_targets[2] = {whole_target, whole_target + CELLS};
  double loss = -1, reference = -2, lowest = 0, highest = 0;
  CHECK(shardtensor_train_step_double(session, in, 1, targets, 2, &loss) == SHARDTENSOR_OK);
  CHECK(shardtensor_train_step_double(single, whole_in, 1, whole_targets, 2, &reference) ==
        SHARDTENSOR_OK);
  MPI_Allreduce(&loss, &lowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&loss, &highest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) printf("onnx train_step: loss %.12g (one rank %.12g)\n", loss, reference);
  CHECK(lowest == highest);
  CHECK(fabs(loss - reference) <= 1e-9 * fabs(reference));
  CHECK(shardtensor_destroy(&single) == SHARDTENSOR_OK);
  CHECK(shardtensor_destroy(&session) == SHARDTENSOR_OK);
  free(x);
  free(y);
  free(target);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  test_before_initialize();
  CHECK(shardtensor_initialize() == SHARDTENSOR_OK);
  CHECK(shardtensor_initialize() == SHARDTENSOR_OK); /* idempotent */

  /* Every rank writes the same checkpoint: rank 0's process id names it. */
  int id = (int)getpid();
  MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
  char path[128];
  snprintf(path, sizeof path, "test_capi_%d_np%d.h5", id, nranks);
  test_session(path);
  test_bad_input();
  test_onnx_session();
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) remove(path);

  CHECK(shardtensor_finalize() == SHARDTENSOR_OK);
  CHECK(shardtensor_finalize() == SHARDTENSOR_OK); /* idempotent */
  shardtensor_session none = NULL;
  CHECK(shardtensor_destroy(&none) == SHARDTENSOR_ERROR_NOT_INITIALIZED);

  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf(total == 0 ? "test_capi: all checks passed\n" : "test_capi: %d FAILED\n", total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
