/* In-situ learning from C: an MPI heat-equation solver trains a surrogate of its own time
 * stepping while it runs, then checks the surrogate's predictions against itself.
 *
 * The solver is plain C + MPI: a periodic 3-D grid split over a Cartesian communicator, its
 * own arrays with one ghost layer, its own ghost exchange (MPI_Sendrecv of faces), explicit
 * finite differences (7-point Laplacian). ShardTensor only sees pointers to those arrays:
 *
 *   phase 1 (online training): keep u(t), take K steps, train_step(u(t) -> u(t + K dt));
 *            new random initial conditions ("episodes") give the model variety;
 *   phase 2 (inference): from a fresh initial condition, at every K-th step predict
 *            u(t + K dt) = infer(u(t)), take K steps, and compare; the no-change guess
 *            u(t + K dt) ~ u(t) is the baseline.
 *
 *   mpirun -np 2 ./example_05_insitu_c --config model.yaml [--checkpoint out.h5]
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardtensor.h"

typedef struct {
  int n;           /* cells per axis of the global grid */
  int k;           /* solver steps per training pair / prediction */
  int episodes;    /* initial conditions used for training */
  int pairs;       /* training pairs per episode */
  int predictions; /* predictions checked in phase 2 */
  double r;        /* kappa dt / dx^2 (explicit scheme: stable up to 1/6) */
  const char* config;
  const char* checkpoint;
} settings;

/* The solver's state on this rank: a patch of lx x ly x lz cells plus one ghost layer. */
typedef struct {
  MPI_Comm cart;
  int n, offset[3], extent[3], allocated[3];
  size_t size;                                    /* values per array, ghosts included */
  double *u, *next;                               /* u[i][j][k], C order */
  MPI_Datatype send_low[3], send_high[3], recv_low[3], recv_high[3]; /* faces per axis */
  int low[3], high[3];                            /* neighbour ranks per axis */
} solver;

static size_t at(const solver* s, int i, int j, int k) {
  return ((size_t)i * s->allocated[1] + j) * s->allocated[2] + k;
}

/* A face of the allocated block: one layer at `start` along `axis`, all cells along the
 * others (so the exchange along a later axis also carries the earlier axes' ghosts). */
static MPI_Datatype face(const solver* s, int axis, int start) {
  int sizes[3], subsizes[3], starts[3] = {0, 0, 0};
  for (int a = 0; a < 3; ++a) sizes[a] = subsizes[a] = s->allocated[a];
  subsizes[axis] = 1;
  starts[axis] = start;
  MPI_Datatype type;
  MPI_Type_create_subarray(3, sizes, subsizes, starts, MPI_ORDER_C, MPI_DOUBLE, &type);
  MPI_Type_commit(&type);
  return type;
}

static void solver_init(solver* s, int n) {
  int nranks, rank, dims[3] = {0, 0, 0}, periods[3] = {1, 1, 1}, coords[3];
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  MPI_Dims_create(nranks, 3, dims);
  MPI_Cart_create(MPI_COMM_WORLD, 3, dims, periods, 1, &s->cart);
  MPI_Comm_rank(s->cart, &rank);
  MPI_Cart_coords(s->cart, rank, 3, coords);
  s->n = n;
  s->size = 1;
  for (int a = 0; a < 3; ++a) {
    s->offset[a] = n * coords[a] / dims[a];
    s->extent[a] = n * (coords[a] + 1) / dims[a] - s->offset[a];
    s->allocated[a] = s->extent[a] + 2;
    s->size *= (size_t)s->allocated[a];
    MPI_Cart_shift(s->cart, a, 1, &s->low[a], &s->high[a]);
  }
  for (int a = 0; a < 3; ++a) {
    s->send_low[a] = face(s, a, 1);
    s->send_high[a] = face(s, a, s->extent[a]);
    s->recv_low[a] = face(s, a, 0);
    s->recv_high[a] = face(s, a, s->extent[a] + 1);
  }
  s->u = calloc(s->size, sizeof(double));
  s->next = calloc(s->size, sizeof(double));
}

static void solver_free(solver* s) {
  for (int a = 0; a < 3; ++a) {
    MPI_Type_free(&s->send_low[a]);
    MPI_Type_free(&s->send_high[a]);
    MPI_Type_free(&s->recv_low[a]);
    MPI_Type_free(&s->recv_high[a]);
  }
  free(s->u);
  free(s->next);
  MPI_Comm_free(&s->cart);
}

static void exchange_ghosts(solver* s, double* field) {
  for (int a = 0; a < 3; ++a) {
    MPI_Sendrecv(field, 1, s->send_high[a], s->high[a], 10 + a, field, 1, s->recv_low[a],
                 s->low[a], 10 + a, s->cart, MPI_STATUS_IGNORE);
    MPI_Sendrecv(field, 1, s->send_low[a], s->low[a], 20 + a, field, 1, s->recv_high[a],
                 s->high[a], 20 + a, s->cart, MPI_STATUS_IGNORE);
  }
}

/* One explicit Euler step of u_t = kappa (u_xx + u_yy + u_zz). */
static void step(solver* s, double r) {
  exchange_ghosts(s, s->u);
  for (int i = 1; i <= s->extent[0]; ++i)
    for (int j = 1; j <= s->extent[1]; ++j)
      for (int k = 1; k <= s->extent[2]; ++k) {
        const double* u = s->u;
        const double c = u[at(s, i, j, k)];
        s->next[at(s, i, j, k)] =
            c + r * (u[at(s, i - 1, j, k)] + u[at(s, i + 1, j, k)] + u[at(s, i, j - 1, k)] +
                     u[at(s, i, j + 1, k)] + u[at(s, i, j, k - 1)] + u[at(s, i, j, k + 1)] -
                     6.0 * c);
      }
  double* t = s->u;
  s->u = s->next;
  s->next = t;
}

/* A deterministic pseudo-random number in [0, 1) (Park and Miller's minimal standard
 * generator): the same on every rank for a seed, and the same as the Fortran example's. */
static double uniform(long long* state) {
  *state = *state * 48271 % 2147483647;
  return (double)*state / 2147483647.0;
}

/* A smooth random initial condition: a sum of Fourier modes with wave numbers up to 3. */
static void initial_condition(solver* s, int seed) {
  enum { modes = 6 };
  double kx[modes], ky[modes], kz[modes], amplitude[modes], phase[modes];
  long long state = 7919LL * seed + 17;
  const double two_pi = 6.283185307179586;
  for (int m = 0; m < modes; ++m) {
    do {
      kx[m] = floor(7 * uniform(&state)) - 3;
      ky[m] = floor(7 * uniform(&state)) - 3;
      kz[m] = floor(7 * uniform(&state)) - 3;
    } while (kx[m] == 0 && ky[m] == 0 && kz[m] == 0); /* no constant mode: zero mean */
    amplitude[m] = 0.5 + uniform(&state);
    phase[m] = two_pi * uniform(&state);
  }
  for (int i = 1; i <= s->extent[0]; ++i)
    for (int j = 1; j <= s->extent[1]; ++j)
      for (int k = 1; k <= s->extent[2]; ++k) {
        const double x = (s->offset[0] + i - 0.5) / s->n, y = (s->offset[1] + j - 0.5) / s->n,
                     z = (s->offset[2] + k - 0.5) / s->n;
        double value = 0;
        for (int m = 0; m < modes; ++m)
          value += amplitude[m] * sin(two_pi * (kx[m] * x + ky[m] * y + kz[m] * z) + phase[m]);
        s->u[at(s, i, j, k)] = value;
      }
}

/* |a - b| / |b| over the owned cells of every rank. */
static double relative_l2(const solver* s, const double* a, const double* b) {
  double sums[2] = {0, 0};
  for (int i = 1; i <= s->extent[0]; ++i)
    for (int j = 1; j <= s->extent[1]; ++j)
      for (int k = 1; k <= s->extent[2]; ++k) {
        const double d = a[at(s, i, j, k)] - b[at(s, i, j, k)];
        sums[0] += d * d;
        sums[1] += b[at(s, i, j, k)] * b[at(s, i, j, k)];
      }
  MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, s->cart);
  return sqrt(sums[0] / sums[1]);
}

/* Stops every rank with the library's message (every session call fails on all ranks). */
static void require(int status, const char* what) {
  if (status == SHARDTENSOR_OK) return;
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) fprintf(stderr, "insitu_c: %s failed: %s\n", what, shardtensor_last_error());
  MPI_Abort(MPI_COMM_WORLD, 2);
}

static settings parse(int argc, char** argv) {
  settings o = {24, 5, 24, 5, 8, 0.12, "model.yaml", NULL};
  for (int a = 1; a + 1 < argc; a += 2) {
    if (!strcmp(argv[a], "--n")) o.n = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--k")) o.k = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--episodes")) o.episodes = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--pairs")) o.pairs = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--predictions")) o.predictions = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--config")) o.config = argv[a + 1];
    else if (!strcmp(argv[a], "--checkpoint")) o.checkpoint = argv[a + 1];
    else {
      fprintf(stderr, "insitu_c: unknown option %s (options: --n --k --episodes --pairs "
                      "--predictions --config --checkpoint)\n", argv[a]);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  return o;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const settings o = parse(argc, argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  require(shardtensor_initialize(), "shardtensor_initialize");

  solver s;
  solver_init(&s, o.n);
  double* before = malloc(s.size * sizeof(double));     /* u(t) */
  double* prediction = calloc(s.size, sizeof(double));  /* the model's u(t + K dt) */

  /* The session sees the solver's patch and arrays as they are: C order, one ghost layer. */
  shardtensor_patch patch = {3, {o.n, o.n, o.n}, {0}, {0}, {1, 1, 1}};
  for (int a = 0; a < 3; ++a) {
    patch.offset[a] = s.offset[a];
    patch.extent[a] = s.extent[a];
  }
  shardtensor_options options;
  shardtensor_options_default(&options);
  options.config = o.config;
  options.array_order = SHARDTENSOR_ORDER_C;
  options.ghost_width = 1;
  shardtensor_session session;
  require(shardtensor_create(s.cart, &patch, &options, &session), "shardtensor_create");
  const double* input[1] = {before};
  const double* target[1] = {s.u};
  double* output[1] = {prediction};

  /* Phase 1: online training on the pairs the solver produces. */
  const double start = MPI_Wtime();
  for (int episode = 0; episode < o.episodes; ++episode) {
    initial_condition(&s, 1001 + episode);
    double loss = 0;
    for (int pair = 0; pair < o.pairs; ++pair) {
      memcpy(before, s.u, s.size * sizeof(double));
      for (int n = 0; n < o.k; ++n) step(&s, o.r);
      target[0] = s.u; /* step() swaps buffers */
      require(shardtensor_train_step_double(session, input, 1, target, 1, &loss), "train_step");
    }
    if (rank == 0)
      printf("episode %2d: %d pairs, last loss %.3e (%.1f s)\n", episode + 1, o.pairs, loss,
             MPI_Wtime() - start);
  }

  /* Phase 2: predictions from a fresh initial condition against the solver. */
  initial_condition(&s, 424242);
  double error_sum = 0, baseline_sum = 0;
  for (int p = 0; p < o.predictions; ++p) {
    memcpy(before, s.u, s.size * sizeof(double));
    require(shardtensor_infer_double(session, input, 1, output, 1), "infer");
    for (int n = 0; n < o.k; ++n) step(&s, o.r);
    const double error = relative_l2(&s, prediction, s.u);
    const double baseline = relative_l2(&s, before, s.u);
    error_sum += error;
    baseline_sum += baseline;
    if (rank == 0)
      printf("step %3d: prediction relative L2 error %.4f, no-change baseline %.4f\n",
             (p + 1) * o.k, error, baseline);
  }
  if (o.checkpoint != NULL) require(shardtensor_save_checkpoint(session, o.checkpoint), "save");

  const double error = error_sum / o.predictions, baseline = baseline_sum / o.predictions;
  if (rank == 0) {
    printf("%.1f s in all\n", MPI_Wtime() - start);
    printf("insitu_c: prediction relative L2 error %.4f (no-change baseline %.4f)\n", error,
           baseline);
  }
  require(shardtensor_destroy(&session), "shardtensor_destroy");
  require(shardtensor_finalize(), "shardtensor_finalize");
  solver_free(&s);
  free(before);
  free(prediction);
  MPI_Finalize();
  /* The surrogate is useful only if it beats doing nothing, clearly. */
  return error < baseline / 3 ? 0 : 1;
}
