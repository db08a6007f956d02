/* C API misuse, one case per run, for the bad-input catalogue (tests/bad_inputs.py):
 *   mpirun -n 3 capi_misuse <case>      (in a directory holding model.yaml and ck_bad.h5)
 * Every rank prints "capi_misuse rank R: status S: MESSAGE" for the call under test and exits
 * with S, so the catalogue checks that every rank returned the error, with one message. A
 * misuse that is accepted prints status 0 and exits 0 (the catalogue counts that a failure).
 * The field: 12 x 12 cells split along x, two input channels, one output channel. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardtensor.h"

enum { N = 12 };
static int rank = 0, nranks = 1;

static shardtensor_patch my_patch(void) {
  shardtensor_patch p;
  memset(&p, 0, sizeof p);
  p.ndims = 2;
  p.global_extent[0] = p.global_extent[1] = N;
  p.offset[0] = N * rank / nranks;
  p.extent[0] = N * (rank + 1) / nranks - p.offset[0];
  p.extent[1] = N;
  return p;
}

static shardtensor_options model_options(void) {
  shardtensor_options o;
  shardtensor_options_default(&o);
  o.config = "model.yaml";
  o.input_channels = 2;
  return o;
}

static int report(int status) {
  printf("capi_misuse rank %d: status %d: %s\n", rank, status,
         status ? shardtensor_last_error() : "accepted");
  fflush(stdout);
  return status;
}

/* A session on the model config, or exit with a message (the case cannot run). */
static shardtensor_session session_or_exit(const shardtensor_patch* patch) {
  const shardtensor_options o = model_options();
  shardtensor_session s = NULL;
  if (shardtensor_create(MPI_COMM_WORLD, patch, &o, &s) != SHARDTENSOR_OK) {
    printf("capi_misuse rank %d: setup failed: %s\n", rank, shardtensor_last_error());
    MPI_Abort(MPI_COMM_WORLD, 99);
  }
  return s;
}

static int run(const char* name) {
  shardtensor_patch patch = my_patch();
  shardtensor_options o = model_options();
  shardtensor_session s = NULL;
  char text[512];
  const int last = rank == nranks - 1;
  if (!strcmp(name, "null-options"))
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, NULL, &s));
  if (!strcmp(name, "config-missing") || !strcmp(name, "config-missing-on-last-rank")) {
    if (!strcmp(name, "config-missing") || last) o.config = "missing.yaml";
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "seed-differs") || !strcmp(name, "lr-differs") ||
      !strcmp(name, "model-too-large")) {
    const int seed = !strcmp(name, "seed-differs") && last ? 4 : 3;
    const double lr = !strcmp(name, "lr-differs") && last ? 2e-3 : 1e-3;
    const int channels = !strcmp(name, "model-too-large") ? 300000 : 4; /* 26 TB */
    snprintf(text, sizeof text,
             "model: {type: unet, depth: 1, base_channels: %d, norm: none, seed: %d}\n"
             "optimizer: {type: adam, lr: %g}\ntraining: {precision: double}\n"
             "data: {normalize: false}\n",
             channels, seed, lr);
    o.config = NULL;
    o.config_text = text;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "patch-overlap")) {
    patch.offset[0] = 0;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "patch-ndims-0")) {
    patch.ndims = 0;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "patch-negative-extent")) {
    if (rank == 0) patch.extent[1] = -N;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "bad-array-order")) {
    o.array_order = 7;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "huge-ghost-width")) {
    o.ghost_width = (int64_t)1 << 40;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "huge-channel-count")) {
    o.input_channels = (int64_t)1 << 62;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "config-file-and-text")) {
    o.config_text = "model: {type: unet}\n";
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "ghost-width-past-open-edge")) {
    o.ghost_width = 1; /* the field is not periodic: are there ghost cells past its edge? */
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "ghost-width-beyond-neighbour")) {
    o.ghost_width = 7; /* 12 cells over 2 or 3 ranks: patches of 6 or 4 */
    o.boundary_ghost_width = 0;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "per-side-widths-partial")) {
    o.ghost_lower[0] = o.ghost_lower[1] = 1;
    o.ghost_upper[0] = 1;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "null-override")) {
    const char* overrides[2] = {"optimizer.lr=0.01", NULL};
    o.overrides = overrides;
    o.noverrides = 2;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "negative-ghost-width")) {
    o.ghost_width = -1;
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }
  if (!strcmp(name, "checkpoint-damaged")) {
    o.config = NULL;
    o.checkpoint = "ck_bad.h5";
    return report(shardtensor_create(MPI_COMM_WORLD, &patch, &o, &s));
  }

  /* Calls on a session. */
  const int64_t cells = patch.extent[0] * patch.extent[1];
  double* in0 = malloc(sizeof(double) * (size_t)cells);
  double* in1 = malloc(sizeof(double) * (size_t)cells);
  double* out = malloc(sizeof(double) * (size_t)cells);
  for (int64_t i = 0; i < cells; ++i) {
    in0[i] = sin(0.3 * (double)(i + patch.offset[0] * N));
    in1[i] = cos(0.2 * (double)(i + patch.offset[0] * N));
  }
  const double* inputs[3] = {in0, in1, in0};
  double* outputs[1] = {out};
  const double* targets[1] = {in0};
  int status = -1;
  s = session_or_exit(&patch);
  if (!strcmp(name, "null-input-array")) {
    if (last) inputs[0] = NULL;
    status = report(shardtensor_infer_double(s, inputs, 2, outputs, 1));
  } else if (!strcmp(name, "too-many-inputs")) {
    status = report(shardtensor_infer_double(s, inputs, 3, outputs, 1));
  } else if (!strcmp(name, "checkpoint-path-differs")) {
    snprintf(text, sizeof text, "rank%d.h5", rank);
    status = report(shardtensor_save_checkpoint(s, text));
  } else if (!strcmp(name, "save-into-missing-dir")) {
    status = report(shardtensor_save_checkpoint(s, "no/such/dir/ck.h5"));
  } else if (!strcmp(name, "save-over-config")) {
    status = report(shardtensor_save_checkpoint(s, "model.yaml"));
  } else if (!strcmp(name, "interleaved-without-components")) {
    /* Two channels interleaved in one array (in0 holds both), components left at 1. */
    const double* interleaved[2] = {in0, in0 + 1};
    status = report(shardtensor_infer_double(s, interleaved, 2, outputs, 1));
  } else if (!strcmp(name, "nan-in-inference-input")) {
    if (last) in0[cells - 1] = INFINITY;
    status = report(shardtensor_infer_double(s, inputs, 2, outputs, 1));
  } else if (!strcmp(name, "nan-in-training-input")) {
    if (last) in1[cells / 2] = NAN;
    double loss = 0;
    status = report(shardtensor_train_step_double(s, inputs, 2, targets, 1, &loss));
  } else {
    printf("capi_misuse rank %d: unknown case '%s'\n", rank, name);
    status = 100;
  }
  shardtensor_destroy(&s);
  free(in0);
  free(in1);
  free(out);
  return status;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc != 2) {
    if (rank == 0) fprintf(stderr, "usage: capi_misuse <case>\n");
    MPI_Finalize();
    return 100;
  }
  shardtensor_initialize();
  const int status = run(argv[1]);
  /* Every rank has printed its line before any exits (mpirun ends the job at the first
   * non-zero exit). */
  MPI_Barrier(MPI_COMM_WORLD);
  shardtensor_finalize();
  MPI_Finalize();
  return status;
}
