/* A PETSc heat solver with a model trained and run in situ, through the C API.
 *
 * The solver is an ordinary PETSc code: a 2-D DMDA (PETSc's own process grid, or explicit
 * uneven ownership ranges), dof unknowns per cell (each diffusing at its own rate), periodic
 * or Dirichlet (u = 0 past the edge) boundaries, explicit Euler steps on ghosted local
 * vectors. Every step a ShardTensor session trains online on the pair (u_n, u_n+1) and then
 * predicts u_n+2 from u_n+1, reading PETSc's ghosted arrays where they are: per-side ghost
 * widths (none past a Dirichlet edge), dof components interleaved, axes in C order (y, x),
 * all described by shardtensor_describe_dmda (shardtensor_petsc.h).
 *
 * Rank 0 checks every step against the same model on one rank over the whole field
 * (gathered in PETSc's natural order): the losses and predictions must agree to 1e-12, else
 * the program exits non-zero.
 *
 *   mpirun -n 4 example_06_petsc -config model.yaml -dof 2 -periodic 0 -uneven 1 -steps 4
 *
 * Options (PETSc's options database): -nx, -ny (cells, default 24 x 20), -dof (1 or 2),
 * -periodic (0 or 1), -uneven (0: PETSc's balanced ranges; 1: explicit uneven ones),
 * -steps, -config (the model's YAML file), -tolerance. */
#include <math.h>
#include <petscdmda.h>
#include <stdio.h>

#include "shardtensor.h"
#include "shardtensor_petsc.h"

/* A ShardTensor call that must succeed: on failure every rank has the same message. */
#define CHECK_ST(call)                                                                   \
  do {                                                                                   \
    if ((call) != SHARDTENSOR_OK) {                                                      \
      PetscPrintf(PETSC_COMM_WORLD, "error: %s\n", shardtensor_last_error());            \
      PetscFinalize();                                                                   \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* Ranges of `cells` over `parts` ranks, deliberately uneven: the first takes what the
 * others leave (each about a third of an even share, an even number: the model pools by 2). */
static void uneven_ranges(PetscInt cells, PetscInt parts, PetscInt* ranges) {
  PetscInt rest = cells;
  for (PetscInt i = 1; i < parts; ++i) {
    ranges[i] = 2 * PetscMax(1, cells / (3 * parts));
    rest -= ranges[i];
  }
  ranges[0] = rest;
}

/* The DMDA: PETSc picks the process grid; with `uneven`, explicit ownership ranges on it. */
static PetscErrorCode create_grid(PetscInt nx, PetscInt ny, PetscInt dof, PetscBool periodic,
                                  PetscBool uneven, DM* da) {
  const DMBoundaryType b = periodic ? DM_BOUNDARY_PERIODIC : DM_BOUNDARY_NONE;
  PetscInt m, n, *lx = NULL, *ly = NULL;
  PetscFunctionBeginUser;
  PetscCall(DMDACreate2d(PETSC_COMM_WORLD, b, b, DMDA_STENCIL_BOX, nx, ny, PETSC_DECIDE,
                         PETSC_DECIDE, dof, 1, NULL, NULL, da));
  PetscCall(DMSetUp(*da));
  if (uneven) {
    PetscCall(DMDAGetInfo(*da, NULL, NULL, NULL, NULL, &m, &n, NULL, NULL, NULL, NULL, NULL, NULL,
                          NULL));
    PetscCall(DMDestroy(da));
    PetscCall(PetscMalloc2(m, &lx, n, &ly));
    uneven_ranges(nx, m, lx);
    uneven_ranges(ny, n, ly);
    PetscCall(DMDACreate2d(PETSC_COMM_WORLD, b, b, DMDA_STENCIL_BOX, nx, ny, m, n, dof, 1, lx, ly,
                           da));
    PetscCall(DMSetUp(*da));
    PetscCall(PetscFree2(lx, ly));
  }
  PetscFunctionReturn(0);
}

/* u_c(x, y) at t = 0: a few smooth modes, different per component. */
static PetscErrorCode initial_condition(DM da, Vec u) {
  PetscInt xs, ys, xm, ym, nx, ny, dof;
  PetscScalar*** a;
  PetscFunctionBeginUser;
  PetscCall(DMDAGetInfo(da, NULL, &nx, &ny, NULL, NULL, NULL, NULL, &dof, NULL, NULL, NULL, NULL,
                        NULL));
  PetscCall(DMDAGetCorners(da, &xs, &ys, NULL, &xm, &ym, NULL));
  PetscCall(DMDAVecGetArrayDOF(da, u, &a));
  for (PetscInt j = ys; j < ys + ym; ++j)
    for (PetscInt i = xs; i < xs + xm; ++i)
      for (PetscInt c = 0; c < dof; ++c) {
        const double x = (i + 0.5) / nx, y = (j + 0.5) / ny;
        a[j][i][c] = sin(PETSC_PI * x * (1 + c)) * sin(PETSC_PI * y) + 0.3 * cos(2 * PETSC_PI * (x + 2 * y + c)) +
                     0.1 * sin(6 * PETSC_PI * x * y);
      }
  PetscCall(DMDAVecRestoreArrayDOF(da, u, &a));
  PetscFunctionReturn(0);
}

/* One explicit Euler step of u_t = kappa_c lap(u_c) from the ghosted `local` into `next`;
 * past a Dirichlet edge u = 0 (the DMDA keeps no ghost cells there). */
static PetscErrorCode heat_step(DM da, Vec local, Vec next) {
  PetscInt xs, ys, xm, ym, nx, ny, dof;
  DMBoundaryType bx;
  const PetscScalar*** u;
  PetscScalar*** v;
  PetscFunctionBeginUser;
  PetscCall(DMDAGetInfo(da, NULL, &nx, &ny, NULL, NULL, NULL, NULL, &dof, NULL, &bx, NULL, NULL,
                        NULL));
  const PetscBool periodic = bx == DM_BOUNDARY_PERIODIC;
  PetscCall(DMDAGetCorners(da, &xs, &ys, NULL, &xm, &ym, NULL));
  PetscCall(DMDAVecGetArrayDOFRead(da, local, &u));
  PetscCall(DMDAVecGetArrayDOF(da, next, &v));
  for (PetscInt j = ys; j < ys + ym; ++j)
    for (PetscInt i = xs; i < xs + xm; ++i)
      for (PetscInt c = 0; c < dof; ++c) {
        const double kappa = 0.2 / (1 + c);  /* times dt / h^2: stable below 0.25 */
        const double west = periodic || i > 0 ? u[j][i - 1][c] : 0.0;
        const double east = periodic || i < nx - 1 ? u[j][i + 1][c] : 0.0;
        const double south = periodic || j > 0 ? u[j - 1][i][c] : 0.0;
        const double north = periodic || j < ny - 1 ? u[j + 1][i][c] : 0.0;
        v[j][i][c] = u[j][i][c] + kappa * (west + east + south + north - 4 * u[j][i][c]);
      }
  PetscCall(DMDAVecRestoreArrayDOFRead(da, local, &u));
  PetscCall(DMDAVecRestoreArrayDOF(da, next, &v));
  PetscFunctionReturn(0);
}

/* The owned cells of a local vector into a global one (DMLocalToGlobal with INSERT_VALUES
 * does the same, but not on a periodic axis of one process). */
static PetscErrorCode owned_cells(DM da, Vec local, Vec global) {
  PetscInt xs, ys, xm, ym, dof;
  const PetscScalar*** from;
  PetscScalar*** to;
  PetscFunctionBeginUser;
  PetscCall(DMDAGetInfo(da, NULL, NULL, NULL, NULL, NULL, NULL, NULL, &dof, NULL, NULL, NULL, NULL,
                        NULL));
  PetscCall(DMDAGetCorners(da, &xs, &ys, NULL, &xm, &ym, NULL));
  PetscCall(DMDAVecGetArrayDOFRead(da, local, &from));
  PetscCall(DMDAVecGetArrayDOF(da, global, &to));
  for (PetscInt j = ys; j < ys + ym; ++j)
    for (PetscInt i = xs; i < xs + xm; ++i)
      for (PetscInt c = 0; c < dof; ++c) to[j][i][c] = from[j][i][c];
  PetscCall(DMDAVecRestoreArrayDOFRead(da, local, &from));
  PetscCall(DMDAVecRestoreArrayDOF(da, global, &to));
  PetscFunctionReturn(0);
}

/* The whole field in natural order (u[y][x][c]) on rank 0: `gathered` (created here). */
static PetscErrorCode gather_natural(DM da, Vec global, Vec natural, Vec* gathered,
                                     VecScatter* scatter) {
  PetscFunctionBeginUser;
  PetscCall(DMDAGlobalToNaturalBegin(da, global, INSERT_VALUES, natural));
  PetscCall(DMDAGlobalToNaturalEnd(da, global, INSERT_VALUES, natural));
  if (*scatter == NULL) PetscCall(VecScatterCreateToZero(natural, scatter, gathered));
  PetscCall(VecScatterBegin(*scatter, natural, *gathered, INSERT_VALUES, SCATTER_FORWARD));
  PetscCall(VecScatterEnd(*scatter, natural, *gathered, INSERT_VALUES, SCATTER_FORWARD));
  PetscFunctionReturn(0);
}

int main(int argc, char** argv) {
  PetscInt nx = 24, ny = 20, dof = 1, periodic = 0, uneven = 0, steps = 4;
  PetscReal tolerance = 1e-12;
  char config[PETSC_MAX_PATH_LEN] = "model.yaml";
  PetscCall(PetscInitialize(&argc, &argv, NULL, NULL));
  PetscCall(PetscOptionsGetInt(NULL, NULL, "-nx", &nx, NULL));
  PetscCall(PetscOptionsGetInt(NULL, NULL, "-ny", &ny, NULL));
  PetscCall(PetscOptionsGetInt(NULL, NULL, "-dof", &dof, NULL));
  PetscCall(PetscOptionsGetInt(NULL, NULL, "-periodic", &periodic, NULL));
  PetscCall(PetscOptionsGetInt(NULL, NULL, "-uneven", &uneven, NULL));
  PetscCall(PetscOptionsGetInt(NULL, NULL, "-steps", &steps, NULL));
  PetscCall(PetscOptionsGetReal(NULL, NULL, "-tolerance", &tolerance, NULL));
  PetscCall(PetscOptionsGetString(NULL, NULL, "-config", config, sizeof config, NULL));
  PetscMPIInt rank, size;
  PetscCallMPI(MPI_Comm_rank(PETSC_COMM_WORLD, &rank));
  PetscCallMPI(MPI_Comm_size(PETSC_COMM_WORLD, &size));

  DM da;
  PetscCall(create_grid(nx, ny, dof, periodic ? PETSC_TRUE : PETSC_FALSE,
                        uneven ? PETSC_TRUE : PETSC_FALSE, &da));
  Vec u, next, u_local, next_local, prediction_local, prediction, natural, whole = NULL;
  VecScatter to_zero = NULL;
  PetscCall(DMCreateGlobalVector(da, &u));
  PetscCall(VecDuplicate(u, &next));
  PetscCall(VecDuplicate(u, &prediction));
  PetscCall(DMCreateLocalVector(da, &u_local));
  PetscCall(VecDuplicate(u_local, &next_local));
  PetscCall(VecDuplicate(u_local, &prediction_local));
  PetscCall(DMDACreateNaturalVector(da, &natural));
  PetscCall(initial_condition(da, u));

  /* The session reads PETSc's ghosted local arrays as they are. */
  CHECK_ST(shardtensor_initialize());
  shardtensor_patch patch;
  shardtensor_options options;
  shardtensor_options_default(&options);
  options.config = config;
  options.input_channels = options.output_channels = dof;
  /* The model pads as the solver's boundaries do: a config override, like --set. */
  const char* padding[1] = {periodic ? "model.padding=periodic" : "model.padding=zeros"};
  options.overrides = padding;
  options.noverrides = 1;
  PetscCall(shardtensor_describe_dmda(da, PETSC_TRUE, &patch, &options));
  shardtensor_session session;
  CHECK_ST(shardtensor_create(PETSC_COMM_WORLD, &patch, &options, &session));
  PetscCall(PetscSynchronizedPrintf(
      PETSC_COMM_WORLD,
      "rank %d: patch (y, x) [%lld, %lld) x [%lld, %lld), ghost cells lower (%lld, %lld) "
      "upper (%lld, %lld), %lld component(s)\n",
      rank, (long long)patch.offset[0], (long long)(patch.offset[0] + patch.extent[0]),
      (long long)patch.offset[1], (long long)(patch.offset[1] + patch.extent[1]),
      (long long)options.ghost_lower[0], (long long)options.ghost_lower[1],
      (long long)options.ghost_upper[0], (long long)options.ghost_upper[1],
      (long long)options.components));
  PetscCall(PetscSynchronizedFlush(PETSC_COMM_WORLD, PETSC_STDOUT));

  /* The reference: the same model on rank 0 alone, over the whole field (natural order,
   * no ghost cells, dof components per cell). */
  shardtensor_session single = NULL;
  if (rank == 0) {
    shardtensor_patch whole_patch = patch;
    shardtensor_options whole_options;
    shardtensor_options_default(&whole_options);
    whole_options.config = config;
    whole_options.input_channels = whole_options.output_channels = dof;
    whole_options.components = dof;
    whole_options.overrides = padding;
    whole_options.noverrides = 1;
    for (int a = 0; a < 2; ++a) {
      whole_patch.offset[a] = 0;
      whole_patch.extent[a] = patch.global_extent[a];
    }
    CHECK_ST(shardtensor_create(MPI_COMM_SELF, &whole_patch, &whole_options, &single));
  }

  double worst_loss = 0, worst_prediction = 0;
  for (PetscInt step = 0; step < steps; ++step) {
    /* The solver's step: u -> next, both ghosted for its stencil. */
    PetscCall(DMGlobalToLocal(da, u, INSERT_VALUES, u_local));
    PetscCall(heat_step(da, u_local, next));
    PetscCall(DMGlobalToLocal(da, next, INSERT_VALUES, next_local));

    /* In situ: train on (u, next), then predict the step after next from next. */
    const PetscScalar *x, *y;
    PetscScalar* p;
    const double *inputs[2], *targets[2];
    double* outputs[2];
    double loss = 0;
    PetscCall(VecGetArrayRead(u_local, &x));
    PetscCall(VecGetArrayRead(next_local, &y));
    PetscCall(VecGetArray(prediction_local, &p));
    for (PetscInt c = 0; c < dof; ++c) inputs[c] = x + c, targets[c] = y + c;
    CHECK_ST(shardtensor_train_step_double(session, inputs, (int)dof, targets, (int)dof, &loss));
    for (PetscInt c = 0; c < dof; ++c) inputs[c] = y + c, outputs[c] = p + c;
    CHECK_ST(shardtensor_infer_double(session, inputs, (int)dof, outputs, (int)dof));
    PetscCall(VecRestoreArrayRead(u_local, &x));
    PetscCall(VecRestoreArrayRead(next_local, &y));
    PetscCall(VecRestoreArray(prediction_local, &p));
    PetscCall(owned_cells(da, prediction_local, prediction));
    if (step == 0) {
      const char* reason;
      CHECK_ST(shardtensor_last_call_copy_reason(session, &reason));
      PetscCall(PetscPrintf(PETSC_COMM_WORLD, "inputs %s%s\n",
                            reason[0] ? "copied: " : "read in place", reason));
    }

    /* The same on one rank: whole fields gathered in natural order. */
    Vec whole_u = NULL, whole_next = NULL, whole_prediction = NULL;
    PetscCall(gather_natural(da, u, natural, &whole, &to_zero));
    PetscCall(VecDuplicate(whole, &whole_u));
    PetscCall(VecCopy(whole, whole_u));
    PetscCall(gather_natural(da, next, natural, &whole, &to_zero));
    PetscCall(VecDuplicate(whole, &whole_next));
    PetscCall(VecCopy(whole, whole_next));
    PetscCall(gather_natural(da, prediction, natural, &whole, &to_zero));
    PetscCall(VecDuplicate(whole, &whole_prediction));
    if (rank == 0) {
      const PetscScalar *wx, *wy, *sharded;
      PetscScalar* wp;
      double reference_loss = 0, diff = 0, scale = 0;
      PetscInt n;
      PetscCall(VecGetArrayRead(whole_u, &wx));
      PetscCall(VecGetArrayRead(whole_next, &wy));
      PetscCall(VecGetArray(whole_prediction, &wp));
      PetscCall(VecGetArrayRead(whole, &sharded));
      PetscCall(VecGetLocalSize(whole, &n));
      for (PetscInt c = 0; c < dof; ++c) inputs[c] = wx + c, targets[c] = wy + c;
      CHECK_ST(shardtensor_train_step_double(single, inputs, (int)dof, targets, (int)dof,
                                             &reference_loss));
      for (PetscInt c = 0; c < dof; ++c) inputs[c] = wy + c, outputs[c] = wp + c;
      CHECK_ST(shardtensor_infer_double(single, inputs, (int)dof, outputs, (int)dof));
      for (PetscInt i = 0; i < n; ++i) {
        diff = PetscMax(diff, PetscAbsReal(sharded[i] - wp[i]));
        scale = PetscMax(scale, PetscAbsReal(wp[i]));
      }
      const double loss_error = fabs(loss - reference_loss) / fabs(reference_loss);
      worst_loss = PetscMax(worst_loss, loss_error);
      worst_prediction = PetscMax(worst_prediction, diff / scale);
      PetscCall(PetscPrintf(PETSC_COMM_SELF,
                            "step %d: loss %.6e (one rank %.6e, relative difference %.1e), "
                            "prediction against one rank %.1e\n",
                            (int)step, loss, reference_loss, loss_error, diff / scale));
      PetscCall(VecRestoreArrayRead(whole_u, &wx));
      PetscCall(VecRestoreArrayRead(whole_next, &wy));
      PetscCall(VecRestoreArray(whole_prediction, &wp));
      PetscCall(VecRestoreArrayRead(whole, &sharded));
    }
    PetscCall(VecDestroy(&whole_u));
    PetscCall(VecDestroy(&whole_next));
    PetscCall(VecDestroy(&whole_prediction));
    PetscCall(VecCopy(next, u));
  }

  int status = 0;
  if (rank == 0) {
    status = worst_loss <= tolerance && worst_prediction <= tolerance ? 0 : 1;
    printf("%d rank(s), dof %d, %s, %s ranges: worst relative difference to one rank: loss "
           "%.1e, prediction %.1e (tolerance %.0e): %s\n",
           (int)size, (int)dof, periodic ? "periodic" : "Dirichlet edges",
           uneven ? "uneven" : "PETSc's", worst_loss, worst_prediction, (double)tolerance,
           status ? "FAILED" : "ok");
  }
  PetscCallMPI(MPI_Bcast(&status, 1, MPI_INT, 0, PETSC_COMM_WORLD));
  if (single) CHECK_ST(shardtensor_destroy(&single));
  CHECK_ST(shardtensor_destroy(&session));
  CHECK_ST(shardtensor_finalize());
  PetscCall(VecScatterDestroy(&to_zero));
  PetscCall(VecDestroy(&whole));
  PetscCall(VecDestroy(&natural));
  PetscCall(VecDestroy(&u));
  PetscCall(VecDestroy(&next));
  PetscCall(VecDestroy(&prediction));
  PetscCall(VecDestroy(&u_local));
  PetscCall(VecDestroy(&next_local));
  PetscCall(VecDestroy(&prediction_local));
  PetscCall(DMDestroy(&da));
  PetscCall(PetscFinalize());
  return status;
}
