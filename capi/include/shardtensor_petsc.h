/* ShardTensor inside a PETSc code: a DMDA's patch and array layout for shardtensor_create.
 *
 * Header-only (nothing of PETSc is linked into ShardTensor): include it after petscdmda.h.
 *
 *   shardtensor_patch patch;
 *   shardtensor_options options;
 *   shardtensor_options_default(&options);
 *   options.config = "model.yaml";
 *   PetscCall(shardtensor_describe_dmda(da, PETSC_TRUE, &patch, &options));
 *   shardtensor_create(PETSC_COMM_WORLD, &patch, &options, &session);
 *   ...
 *   DMGlobalToLocal(da, U, INSERT_VALUES, Ulocal);
 *   VecGetArrayRead(Ulocal, &u);                  u[j][i][c] of the ghosted patch, flat
 *   const double* in[2] = {u, u + 1};             one pointer per component (dof = 2)
 *
 * What it describes, and why by hand it is easy to get wrong:
 *  - Axis order. A DMDA's arrays are indexed u[k][j][i] (C order, x fastest), so the patch
 *    lists its axes as (z, y, x), (y, x) or (x): the reverse of DMDAGetInfo's (M, N, P).
 *    Described as (x, y) the patch still tiles the field and one rank still agrees with
 *    itself, but on several ranks every patch is read transposed.
 *  - Ghost cells. A ghosted (local) vector has stencil-width ghost cells on every side that
 *    faces another patch or a periodic wrap, and none past a non-periodic edge: the widths
 *    differ per rank and per side, and come from DMDAGetCorners and DMDAGetGhostCorners.
 *  - dof. Several unknowns per cell are interleaved, the component fastest: components = dof,
 *    and channel c is the array u + c.
 *
 * `ghosted`: PETSC_TRUE for arrays of local vectors (DMGetLocalVector, DMGlobalToLocal),
 * PETSC_FALSE for arrays of global vectors (no ghost cells). Every array handed to the session
 * must then be of that kind. Only the patch and options->array_order, ghost_width,
 * boundary_ghost_width, ghost_lower, ghost_upper and components are set. */
#ifndef SHARDTENSOR_PETSC_H
#define SHARDTENSOR_PETSC_H

#include <petscdmda.h>

#include "shardtensor.h"

static inline PetscErrorCode shardtensor_describe_dmda(DM da, PetscBool ghosted,
                                                       shardtensor_patch* patch,
                                                       shardtensor_options* options) {
  PetscInt dim, extent[3], dof, start[3], owned[3], ghost_start[3], ghost_owned[3];
  DMBoundaryType boundary[3];
  PetscFunctionBeginUser;
  PetscCall(DMDAGetInfo(da, &dim, &extent[0], &extent[1], &extent[2], NULL, NULL, NULL, &dof,
                        NULL, &boundary[0], &boundary[1], &boundary[2], NULL));
  PetscCall(DMDAGetCorners(da, &start[0], &start[1], &start[2], &owned[0], &owned[1], &owned[2]));
  PetscCall(DMDAGetGhostCorners(da, &ghost_start[0], &ghost_start[1], &ghost_start[2],
                                &ghost_owned[0], &ghost_owned[1], &ghost_owned[2]));
  patch->ndims = (int)dim;
  options->array_order = SHARDTENSOR_ORDER_C;
  options->ghost_width = 0;
  options->boundary_ghost_width = 0;
  options->components = (int64_t)dof;
  for (int a = 0; a < 3; ++a) {
    /* Axis a of the patch is PETSc's axis dim - 1 - a: x is the last (fastest) index. */
    const int p = (int)dim - 1 - a;
    if (a >= dim) {
      patch->global_extent[a] = patch->offset[a] = patch->extent[a] = 0;
      patch->periodic[a] = 0;
      options->ghost_lower[a] = options->ghost_upper[a] = -1;
      continue;
    }
    patch->global_extent[a] = (int64_t)extent[p];
    patch->offset[a] = (int64_t)start[p];
    patch->extent[a] = (int64_t)owned[p];
    patch->periodic[a] = boundary[p] == DM_BOUNDARY_PERIODIC;
    options->ghost_lower[a] = ghosted ? (int64_t)(start[p] - ghost_start[p]) : 0;
    options->ghost_upper[a] =
        ghosted ? (int64_t)(ghost_start[p] + ghost_owned[p] - start[p] - owned[p]) : 0;
  }
  PetscFunctionReturn(0);
}

#endif /* SHARDTENSOR_PETSC_H */
