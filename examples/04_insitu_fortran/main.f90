! In-situ learning from Fortran: an MPI heat-equation solver trains a surrogate of its own
! time stepping while it runs, then checks the surrogate's predictions against itself.
!
! The solver is plain Fortran + MPI: a periodic 3-D grid split over a Cartesian communicator,
! its own arrays u(0:nx+1, 0:ny+1, 0:nz+1) with one ghost layer, its own ghost exchange
! (MPI_Sendrecv of faces), explicit finite differences (7-point Laplacian). ShardTensor only
! sees those arrays (Fortran order, ghosts included):
!
!   phase 1 (online training): keep u(t), take K steps, train_step(u(t) -> u(t + K dt));
!            new random initial conditions ("episodes") give the model variety;
!   phase 2 (inference): from a fresh initial condition, at every K-th step predict
!            u(t + K dt) = infer(u(t)), take K steps and compare; the no-change guess
!            u(t + K dt) ~ u(t) is the baseline.
!
!   mpirun -np 2 ./example_04_insitu_fortran model.yaml [checkpoint.h5]
program insitu_fortran
  use, intrinsic :: iso_c_binding
  use mpi
  use shardtensor
  implicit none

  integer, parameter :: n = 24          ! cells per axis of the global grid
  integer, parameter :: k_steps = 5     ! solver steps per training pair / prediction
  integer, parameter :: episodes = 24, pairs = 5, predictions = 8
  real(c_double), parameter :: r = 0.12d0  ! kappa dt / dx^2 (stable up to 1/6)

  integer :: ierr, rank, nranks, cart, dims(3), coords(3), low(3), high(3), lo(3), ext(3)
  integer :: face_lo_send(3), face_hi_send(3), face_lo_recv(3), face_hi_recv(3)
  integer :: a, episode, pair, p, s
  logical :: periods(3)
  real(c_double), allocatable, target :: u(:, :, :), next(:, :, :), before(:, :, :), &
                                         prediction(:, :, :)
  real(c_double) :: loss, error, baseline, error_sum, baseline_sum, start
  character(len=512) :: config, checkpoint
  type(shardtensor_patch) :: patch
  type(c_ptr) :: session

  call MPI_Init(ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  config = "model.yaml"
  checkpoint = ""
  if (command_argument_count() >= 1) call get_command_argument(1, config)
  if (command_argument_count() >= 2) call get_command_argument(2, checkpoint)
  call require(shardtensor_initialize(), "shardtensor_initialize")

  ! The solver's decomposition: a periodic Cartesian process grid, balanced patches.
  dims = 0
  periods = .true.
  call MPI_Dims_create(nranks, 3, dims, ierr)
  call MPI_Cart_create(MPI_COMM_WORLD, 3, dims, periods, .true., cart, ierr)
  call MPI_Comm_rank(cart, rank, ierr)
  call MPI_Cart_coords(cart, rank, 3, coords, ierr)
  do a = 1, 3
    lo(a) = n * coords(a) / dims(a)
    ext(a) = n * (coords(a) + 1) / dims(a) - lo(a)
    call MPI_Cart_shift(cart, a - 1, 1, low(a), high(a), ierr)
  end do
  allocate(u(0:ext(1)+1, 0:ext(2)+1, 0:ext(3)+1))
  allocate(next, before, prediction, mold=u)
  u = 0
  next = 0
  prediction = 0
  do a = 1, 3
    face_lo_send(a) = face(a, 1)
    face_hi_send(a) = face(a, ext(a))
    face_lo_recv(a) = face(a, 0)
    face_hi_recv(a) = face(a, ext(a) + 1)
  end do

  ! The session sees the solver's patch (0-based offsets) and arrays as they are.
  patch = shardtensor_patch(3, [n, n, n], lo, ext, [1, 1, 1])
  call require(shardtensor_create(cart, patch, session, config=trim(config), ghost_width=1), &
               "shardtensor_create")

  ! Phase 1: online training on the pairs the solver produces.
  start = MPI_Wtime()
  do episode = 1, episodes
    call initial_condition(1000 + episode)
    do pair = 1, pairs
      before = u
      do s = 1, k_steps
        call step()
      end do
      call require(shardtensor_train_step(session, before, u, loss), "train_step")
    end do
    if (rank == 0) print '(a, i2, a, i0, a, es10.3, a, f6.1, a)', "episode ", episode, ": ", &
        pairs, " pairs, last loss ", loss, " (", MPI_Wtime() - start, " s)"
  end do

  ! Phase 2: predictions from a fresh initial condition against the solver.
  call initial_condition(424242)
  error_sum = 0
  baseline_sum = 0
  do p = 1, predictions
    before = u
    call require(shardtensor_infer(session, before, prediction), "infer")
    do s = 1, k_steps
      call step()
    end do
    error = relative_l2(prediction, u)
    baseline = relative_l2(before, u)
    error_sum = error_sum + error
    baseline_sum = baseline_sum + baseline
    if (rank == 0) print '(a, i3, a, f7.4, a, f7.4)', "step ", p * k_steps, &
        ": prediction relative L2 error ", error, ", no-change baseline ", baseline
  end do
  if (len_trim(checkpoint) > 0) &
      call require(shardtensor_save_checkpoint(session, trim(checkpoint)), "save_checkpoint")

  error = error_sum / predictions
  baseline = baseline_sum / predictions
  if (rank == 0) then
    print '(f6.1, a)', MPI_Wtime() - start, " s in all"
    print '(a, f6.4, a, f6.4, a)', "insitu_fortran: prediction relative L2 error ", error, &
        " (no-change baseline ", baseline, ")"
  end if
  call require(shardtensor_destroy(session), "shardtensor_destroy")
  call require(shardtensor_finalize(), "shardtensor_finalize")
  do a = 1, 3
    call MPI_Type_free(face_lo_send(a), ierr)
    call MPI_Type_free(face_hi_send(a), ierr)
    call MPI_Type_free(face_lo_recv(a), ierr)
    call MPI_Type_free(face_hi_recv(a), ierr)
  end do
  call MPI_Comm_free(cart, ierr)
  call MPI_Finalize(ierr)
  ! The surrogate is useful only if it beats doing nothing, clearly.
  if (.not. error < baseline / 3) error stop 1

contains

  ! One layer (index `start` along `axis`) of the allocated block, all cells along the other
  ! axes, so the exchange along a later axis also carries the earlier axes' ghosts.
  integer function face(axis, start) result(type)
    integer, intent(in) :: axis, start
    integer :: sizes(3), subsizes(3), starts(3), ierror
    sizes = ext + 2
    subsizes = sizes
    subsizes(axis) = 1
    starts = 0
    starts(axis) = start
    call MPI_Type_create_subarray(3, sizes, subsizes, starts, MPI_ORDER_FORTRAN, &
                                  MPI_DOUBLE_PRECISION, type, ierror)
    call MPI_Type_commit(type, ierror)
  end function

  subroutine exchange_ghosts()
    integer :: axis, ierror
    do axis = 1, 3
      call MPI_Sendrecv(u, 1, face_hi_send(axis), high(axis), 10 + axis, &
                        u, 1, face_lo_recv(axis), low(axis), 10 + axis, cart, &
                        MPI_STATUS_IGNORE, ierror)
      call MPI_Sendrecv(u, 1, face_lo_send(axis), low(axis), 20 + axis, &
                        u, 1, face_hi_recv(axis), high(axis), 20 + axis, cart, &
                        MPI_STATUS_IGNORE, ierror)
    end do
  end subroutine

  ! One explicit Euler step of u_t = kappa (u_xx + u_yy + u_zz).
  subroutine step()
    integer :: i, j, k
    call exchange_ghosts()
    do k = 1, ext(3)
      do j = 1, ext(2)
        do i = 1, ext(1)
          next(i, j, k) = u(i, j, k) + r * (u(i-1, j, k) + u(i+1, j, k) + u(i, j-1, k) + &
                                            u(i, j+1, k) + u(i, j, k-1) + u(i, j, k+1) - &
                                            6 * u(i, j, k))
        end do
      end do
    end do
    u(1:ext(1), 1:ext(2), 1:ext(3)) = next(1:ext(1), 1:ext(2), 1:ext(3))
  end subroutine

  ! A deterministic pseudo-random number in [0, 1): the same on every rank for a seed.
  real(c_double) function uniform(state)
    integer(c_int64_t), intent(inout) :: state
    state = modulo(state * 48271_c_int64_t, 2147483647_c_int64_t)
    uniform = real(state, c_double) / 2147483647d0
  end function

  ! A smooth random initial condition: a sum of Fourier modes with wave numbers up to 3.
  subroutine initial_condition(seed)
    integer, intent(in) :: seed
    integer, parameter :: modes = 6
    real(c_double), parameter :: two_pi = 6.283185307179586d0
    real(c_double) :: wave(3, modes), amplitude(modes), phase(modes), x(3)
    integer(c_int64_t) :: state
    integer :: m, i, j, k
    state = 7919_c_int64_t * seed + 17
    do m = 1, modes
      do
        wave(1, m) = floor(7 * uniform(state)) - 3
        wave(2, m) = floor(7 * uniform(state)) - 3
        wave(3, m) = floor(7 * uniform(state)) - 3
        if (any(wave(:, m) /= 0)) exit  ! no constant mode: zero mean
      end do
      amplitude(m) = 0.5d0 + uniform(state)
      phase(m) = two_pi * uniform(state)
    end do
    do k = 1, ext(3)
      do j = 1, ext(2)
        do i = 1, ext(1)
          x = (real(lo + [i, j, k], c_double) - 0.5d0) / n
          u(i, j, k) = sum(amplitude * sin(two_pi * matmul(x, wave) + phase))
        end do
      end do
    end do
  end subroutine

  ! |a - b| / |b| over the owned cells of every rank.
  real(c_double) function relative_l2(a, b)
    real(c_double), intent(in) :: a(0:, 0:, 0:), b(0:, 0:, 0:)
    real(c_double) :: sums(2)
    integer :: ierror
    sums(1) = sum((a(1:ext(1), 1:ext(2), 1:ext(3)) - b(1:ext(1), 1:ext(2), 1:ext(3)))**2)
    sums(2) = sum(b(1:ext(1), 1:ext(2), 1:ext(3))**2)
    call MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE_PRECISION, MPI_SUM, cart, ierror)
    relative_l2 = sqrt(sums(1) / sums(2))
  end function

  ! Stops every rank with the library's message (every session call fails on all ranks).
  subroutine require(status, what)
    integer(c_int), intent(in) :: status
    character(*), intent(in) :: what
    integer :: ierror
    if (status == SHARDTENSOR_OK) return
    print '(a, a, a, a)', "insitu_fortran: ", what, " failed: ", shardtensor_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 2, ierror)
  end subroutine

end program insitu_fortran
