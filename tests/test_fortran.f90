! The Fortran module: a session on Fortran-order arrays with ghost cells (on a Cartesian
! communicator) computes what one rank computes on the whole field; one train_step gives one
! rank's loss on every rank; a bad call returns an error code and shardtensor_last_error()
! names the problem. Run at 1 and 2 ranks.
program test_fortran
  use, intrinsic :: iso_c_binding
  use mpi
  use shardtensor
  implicit none

  integer, parameter :: gx = 12, gy = 8, gz = 6
  integer :: ierr, rank, nranks, cart, failures, total, d, status
  integer :: dims(3), coords(3), lo(3), n(3)
  logical :: periods(3)
  type(shardtensor_patch) :: patch, whole
  type(c_ptr) :: session, single, interleaved
  real(c_double), allocatable, target :: u(:, :, :), p(:, :, :), t(:, :, :)
  real(c_double), allocatable, target :: wu(:, :, :), wp(:, :, :), wt(:, :, :)
  real(c_double), allocatable, target :: v(:, :, :, :), q(:, :, :, :), wp_before_training(:, :, :)
  real(c_double) :: loss, reference, lowest, highest, diff, scale
  type(c_ptr) :: inputs(2), outputs(1)
  character(len=:), allocatable :: config, message, reason

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  failures = 0

  ! A double model (so sharded equals one rank to rounding), one field in, one out.
  config = "model: {type: unet, depth: 1, base_channels: 4, norm: none, activation: gelu," // &
           " padding: periodic, input_skip: true, seed: 5}" // new_line('a') // &
           "optimizer: {type: adam, lr: 0.01}" // new_line('a') // &
           "training: {precision: double, loss: mse}" // new_line('a') // &
           "data: {normalize: false}" // new_line('a')

  session = c_null_ptr
  call check(shardtensor_destroy(session) == SHARDTENSOR_ERROR_NOT_INITIALIZED, &
             "a call before initialize")
  call check(index(shardtensor_last_error(), "shardtensor_initialize") > 0, &
             "the message names shardtensor_initialize")
  call check(shardtensor_initialize() == SHARDTENSOR_OK, "initialize")

  ! The solver's own decomposition: a periodic Cartesian communicator.
  dims = 0
  call MPI_Dims_create(nranks, 3, dims, ierr)
  periods = .true.
  call MPI_Cart_create(MPI_COMM_WORLD, 3, dims, periods, .true., cart, ierr)
  call MPI_Cart_coords(cart, rank, 3, coords, ierr)
  patch%ndims = 3
  patch%global_extent = [gx, gy, gz]
  do d = 1, 3
    lo(d) = int(patch%global_extent(d)) * coords(d) / dims(d)
    n(d) = int(patch%global_extent(d)) * (coords(d) + 1) / dims(d) - lo(d)
  end do
  patch%offset = lo
  patch%extent = n
  patch%periodic = 1
  whole = shardtensor_patch(3, [gx, gy, gz], [0, 0, 0], [gx, gy, gz], [1, 1, 1])

  call check(shardtensor_create(cart, patch, session, config_text=config, ghost_width=1) == &
             SHARDTENSOR_OK, "create on the Cartesian communicator")
  call check(shardtensor_create(MPI_COMM_SELF, whole, single, config_text=config) == &
             SHARDTENSOR_OK, "create on MPI_COMM_SELF")
  if (failures > 0) print *, shardtensor_last_error()

  ! Fortran-order arrays with one ghost layer, ghosts full of a value the model must ignore.
  allocate(u(0:n(1)+1, 0:n(2)+1, 0:n(3)+1), p(0:n(1)+1, 0:n(2)+1, 0:n(3)+1), &
           t(0:n(1)+1, 0:n(2)+1, 0:n(3)+1))
  allocate(wu(0:gx-1, 0:gy-1, 0:gz-1), wp(0:gx-1, 0:gy-1, 0:gz-1), wt(0:gx-1, 0:gy-1, 0:gz-1))
  u = 1.0d3
  p = -7.0d0
  call fill_owned(u, 1)
  call fill_whole(wu, 1)

  call check(shardtensor_infer(session, u, p) == SHARDTENSOR_OK, "infer")
  call check(shardtensor_infer(single, wu, wp) == SHARDTENSOR_OK, "infer on one rank")
  call compare(p, wp)
  wp_before_training = wp
  if (rank == 0) print '(a, es10.3)', "infer: sharded vs one rank, relative difference ", diff / scale
  call check(diff <= 1.0d-12 * scale, "sharded infer equals one rank")
  call check(all(p(0, :, :) == -7.0d0) .and. all(p(:, :, n(3)+1) == -7.0d0), "ghosts kept")

  ! The raw interface with arrays of pointers computes the same.
  p = 0
  inputs(1) = c_loc(u)
  outputs(1) = c_loc(p)
  call check(shardtensor_infer_double(session, inputs, 1, outputs, 1) == SHARDTENSOR_OK, &
             "raw infer")
  call compare(p, wp)
  call check(diff <= 1.0d-12 * scale, "raw infer equals one rank")

  ! One train_step: the same loss on every rank, equal to one rank's.
  t = 0
  call fill_owned(t, 2)
  call fill_whole(wt, 2)
  call check(shardtensor_train_step(session, u, t, loss) == SHARDTENSOR_OK, "train_step")
  call check(shardtensor_train_step(single, wu, wt, reference) == SHARDTENSOR_OK, &
             "train_step on one rank")
  call MPI_Allreduce(loss, lowest, 1, MPI_DOUBLE_PRECISION, MPI_MIN, MPI_COMM_WORLD, ierr)
  call MPI_Allreduce(loss, highest, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a, es20.12, a, es20.12)', "train_step: loss ", loss, ", one rank ", reference
  call check(lowest == highest, "the same loss on every rank")
  call check(abs(loss - reference) <= 1.0d-10 * abs(reference), "loss equals one rank's")

  ! Interleaved components through the raw interface: v(c, x, y, z) holds two values per cell,
  ! the input in component 2 (component 1 a value the model must not see), per-side widths
  ! given explicitly, config overrides from Fortran strings. Equal to one rank.
  allocate(v(2, 0:n(1)+1, 0:n(2)+1, 0:n(3)+1), q(2, 0:n(1)+1, 0:n(2)+1, 0:n(3)+1))
  v(1, :, :, :) = 5.0d2
  v(2, :, :, :) = u
  q = -3.0d0
  call check(shardtensor_create(cart, patch, interleaved, config_text=config, &
                                ghost_lower=[1, 1, 1], ghost_upper=[1, 1, 1], components=2, &
                                overrides=[character(len=20) :: "optimizer.lr=0.02", &
                                           "training.loss=mse"]) == &
             SHARDTENSOR_OK, "create with components, per-side widths and overrides")
  if (failures > 0) print *, shardtensor_last_error()
  inputs(1) = c_loc(v(2, 0, 0, 0))
  outputs(1) = c_loc(q(1, 0, 0, 0))
  call check(shardtensor_infer_double(interleaved, inputs, 1, outputs, 1) == SHARDTENSOR_OK, &
             "infer on interleaved components")
  p = q(1, :, :, :)
  call compare(p, wp_before_training)
  call check(diff <= 1.0d-12 * scale, "interleaved infer equals one rank")
  call check(all(q(2, :, :, :) == -3.0d0), "the other component is not written")
  call check(shardtensor_last_call_copy_reason(interleaved, reason) == SHARDTENSOR_OK, &
             "copy reason")
  call check(index(reason, "Fortran") > 0, "copy reason: " // reason)
  call check(shardtensor_destroy(interleaved) == SHARDTENSOR_OK, "destroy interleaved")

  ! Bad calls: an error code on every rank and a message naming the problem.
  inputs(2) = c_loc(u)
  status = shardtensor_infer_double(session, inputs, 2, outputs, 1)
  message = shardtensor_last_error()
  call check(status == SHARDTENSOR_ERROR_INVALID_ARGUMENT, "two inputs for a one-input model")
  call check(index(message, "ninputs is 2, the session's model has 1 input channel(s)") > 0, &
             "message: " // message)
  status = shardtensor_load_checkpoint(session, "no/such/checkpoint.h5")
  message = shardtensor_last_error()
  call check(status == SHARDTENSOR_ERROR_FAILED, "load a missing checkpoint")
  call check(index(message, "no/such/checkpoint.h5") > 0, "message: " // message)
  if (rank == 0) print '(a, a)', "last_error: ", message

  call check(shardtensor_destroy(session) == SHARDTENSOR_OK, "destroy")
  call check(.not. c_associated(session), "destroy nulls the handle")
  call check(shardtensor_destroy(single) == SHARDTENSOR_OK, "destroy one-rank session")
  call check(shardtensor_finalize() == SHARDTENSOR_OK, "finalize")

  call MPI_Allreduce(failures, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) then
    if (total == 0) then
      print '(a)', "test_fortran: all checks passed"
    else
      print '(a, i0, a)', "test_fortran: ", total, " FAILED"
    end if
  end if
  call MPI_Comm_free(cart, ierr)
  call MPI_Finalize(ierr)
  if (total /= 0) error stop 1

contains

  subroutine check(condition, what)
    logical, intent(in) :: condition
    character(*), intent(in) :: what
    if (.not. condition) then
      failures = failures + 1
      print '(a, i0, a, a)', "rank ", rank, ": FAILED: ", what
    end if
  end subroutine

  real(c_double) function value_at(seed, x, y, z)
    integer, intent(in) :: seed, x, y, z
    value_at = sin(0.7d0 * x + 1.3d0 * y + 0.4d0 * z + seed) + 0.3d0 * cos(1.1d0 * x * y + 0.5d0 * z)
  end function

  ! Owned cells (1..n) of a ghosted array, from global 0-based cell numbers.
  subroutine fill_owned(a, seed)
    real(c_double), intent(inout) :: a(0:, 0:, 0:)
    integer, intent(in) :: seed
    integer :: i, j, k
    do k = 1, n(3)
      do j = 1, n(2)
        do i = 1, n(1)
          a(i, j, k) = value_at(seed, lo(1) + i - 1, lo(2) + j - 1, lo(3) + k - 1)
        end do
      end do
    end do
  end subroutine

  subroutine fill_whole(a, seed)
    real(c_double), intent(out) :: a(0:, 0:, 0:)
    integer, intent(in) :: seed
    integer :: i, j, k
    do k = 0, gz - 1
      do j = 0, gy - 1
        do i = 0, gx - 1
          a(i, j, k) = value_at(seed, i, j, k)
        end do
      end do
    end do
  end subroutine

  ! diff = max |sharded - whole| and scale = max |whole| over all ranks' owned cells.
  subroutine compare(sharded, reference_field)
    real(c_double), intent(in) :: sharded(0:, 0:, 0:), reference_field(0:, 0:, 0:)
    integer :: i, j, k
    diff = 0
    scale = 0
    do k = 1, n(3)
      do j = 1, n(2)
        do i = 1, n(1)
          diff = max(diff, abs(sharded(i, j, k) - &
                               reference_field(lo(1) + i - 1, lo(2) + j - 1, lo(3) + k - 1)))
          scale = max(scale, abs(reference_field(lo(1) + i - 1, lo(2) + j - 1, lo(3) + k - 1)))
        end do
      end do
    end do
    call MPI_Allreduce(MPI_IN_PLACE, diff, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD, ierr)
    call MPI_Allreduce(MPI_IN_PLACE, scale, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD, ierr)
  end subroutine

end program test_fortran
