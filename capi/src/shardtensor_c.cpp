// The C API (capi/include/shardtensor.h) on top of shardtensor::Session.
//
// Every entry point runs its body inside `guarded`, which turns exceptions into status codes
// and a thread-local message: nothing is thrown across the C boundary. Argument problems a
// rank can see on its own (a NULL array list, a wrong channel count) are agreed over the
// session's communicator before the call goes on, so every rank returns the same error and
// none waits in a collective the others never enter.

#include "shardtensor.h"

#include <Kokkos_Core.hpp>
#include <atomic>
#include <exception>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/environment.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/embed/session.hpp"

/// The opaque handle: the session and its own duplicate of the solver's communicator, used
/// only to agree on argument errors before a collective call.
struct shardtensor_session_s {
  shardtensor::Communicator comm;
  shardtensor::Session session;
  int64_t input_channels;
  int64_t output_channels;
};

namespace {

thread_local std::string last_error;

std::atomic<bool> initialized{false};
std::atomic<bool> kokkos_initialized_here{false};  // finalize finalizes Kokkos only then
std::atomic<bool> kokkos_finalized_here{false};    // Kokkos cannot start twice in a process
std::atomic<int> live_sessions{0};

/// An argument error all ranks agreed on: SHARDTENSOR_ERROR_INVALID_ARGUMENT.
struct ArgumentError : shardtensor::Error {
  using shardtensor::Error::Error;
};

int fail(int status, std::string message) {
  last_error = std::move(message);
  return status;
}

int not_initialized(const char* function) {
  return fail(SHARDTENSOR_ERROR_NOT_INITIALIZED,
              std::string(function) +
                  ": the library is not initialized: call shardtensor_initialize() after MPI_Init");
}

/// A NULL handle or output pointer: a local error, returned only on the ranks that pass it
/// (with no session there is no communicator to agree over).
int null_argument(const char* function, const std::string& what) {
  if (!initialized) return not_initialized(function);
  return fail(SHARDTENSOR_ERROR_INVALID_ARGUMENT, std::string(function) + ": " + what);
}

/// Runs `body` (which returns nothing or throws). shardtensor::Error becomes `error_status`
/// (what the library's own errors mean for this function), ArgumentError always
/// SHARDTENSOR_ERROR_INVALID_ARGUMENT, anything else SHARDTENSOR_ERROR_FAILED.
template <class F>
int guarded(const char* function, int error_status, F&& body) {
  if (!initialized) return not_initialized(function);
  try {
    body();
    return SHARDTENSOR_OK;
  } catch (const ArgumentError& e) {
    return fail(SHARDTENSOR_ERROR_INVALID_ARGUMENT, std::string(function) + ": " + e.what());
  } catch (const shardtensor::Error& e) {
    return fail(error_status, std::string(function) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return fail(SHARDTENSOR_ERROR_FAILED, std::string(function) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(SHARDTENSOR_ERROR_FAILED, std::string(function) + ": " + e.what());
  } catch (...) {
    return fail(SHARDTENSOR_ERROR_FAILED, std::string(function) + ": unknown exception");
  }
}

/// Collective: every rank passes its own problem ("" if none); if any rank has one, every
/// rank throws ArgumentError with the first failing rank's message.
void agree_on_arguments(const shardtensor::Communicator& comm, const std::string& problem) {
  try {
    comm.agree(problem);
  } catch (const shardtensor::Error& e) {
    throw ArgumentError(e.what());
  }
}

template <class P>
std::string array_list_problem(P const* arrays, int count, int64_t channels, const char* name) {
  std::ostringstream out;
  if (count != channels)
    out << "n" << name << " is " << count << ", the session's model has " << channels << " "
        << (std::string(name) == "inputs" ? "input" : "output") << " channel(s)";
  else if (arrays == nullptr)
    out << name << " is NULL (expected a list of " << count << " array pointers)";
  else
    for (int c = 0; c < count; ++c)
      if (arrays[c] == nullptr) {
        out << name << "[" << c << "] is NULL";
        break;
      }
  return out.str();
}

/// Per-side widths are all given (>= 0 on the patch's axes) or all -1 ("" if so).
std::string per_side_widths_problem(const shardtensor_options& options, int ndims) {
  int given = 0;
  for (int d = 0; d < ndims; ++d)
    given += (options.ghost_lower[d] != -1) + (options.ghost_upper[d] != -1);
  if (given == 0 || given == 2 * ndims) return "";
  std::ostringstream out;
  out << "options->ghost_lower and ghost_upper give " << given << " of the " << 2 * ndims
      << " widths of a " << ndims << "-axis patch: lower (";
  for (int d = 0; d < ndims; ++d) out << (d ? ", " : "") << options.ghost_lower[d];
  out << "), upper (";
  for (int d = 0; d < ndims; ++d) out << (d ? ", " : "") << options.ghost_upper[d];
  out << "); give every one (-1 for none: then ghost_width applies)";
  return out.str();
}

template <class T>
std::vector<const T*> const_list(const T* const* arrays, int count) {
  return std::vector<const T*>(arrays, arrays + count);
}

template <class T>
int infer(const char* function, shardtensor_session session, const T* const* inputs, int ninputs,
          T* const* outputs, int noutputs) {
  if (session == nullptr) return null_argument(function, "the session is NULL");
  return guarded(function, SHARDTENSOR_ERROR_FAILED, [&] {
    std::string problem = array_list_problem(inputs, ninputs, session->input_channels, "inputs");
    if (problem.empty())
      problem = array_list_problem(outputs, noutputs, session->output_channels, "outputs");
    agree_on_arguments(session->comm, problem);
    session->session.infer(const_list(inputs, ninputs),
                           std::vector<T*>(outputs, outputs + noutputs));
  });
}

template <class T>
int train_step(const char* function, shardtensor_session session, const T* const* inputs,
               int ninputs, const T* const* targets, int ntargets, double* loss) {
  if (session == nullptr) return null_argument(function, "the session is NULL");
  return guarded(function, SHARDTENSOR_ERROR_FAILED, [&] {
    std::string problem = array_list_problem(inputs, ninputs, session->input_channels, "inputs");
    if (problem.empty())
      problem = array_list_problem(targets, ntargets, session->output_channels, "targets");
    agree_on_arguments(session->comm, problem);
    const double value =
        session->session.train_step(const_list(inputs, ninputs), const_list(targets, ntargets));
    if (loss != nullptr) *loss = value;
  });
}

int create(const char* function, MPI_Comm comm, const shardtensor_patch* patch,
           const shardtensor_options* options, shardtensor_session* session) {
  if (session != nullptr) *session = nullptr;
  if (comm == MPI_COMM_NULL) return null_argument(function, "the communicator is MPI_COMM_NULL");
  // Whatever the Session constructor rejects is about the arguments (patch, options, config,
  // checkpoint), so its errors are SHARDTENSOR_ERROR_INVALID_ARGUMENT.
  return guarded(function, SHARDTENSOR_ERROR_INVALID_ARGUMENT, [&] {
    shardtensor::Communicator own(comm);
    std::ostringstream problem;
    if (session == nullptr)
      problem << "session is NULL (expected the address of a shardtensor_session)";
    else if (patch == nullptr)
      problem << "patch is NULL";
    else if (options == nullptr)
      problem << "options is NULL (fill one with shardtensor_options_default)";
    else if (patch->ndims < 1 || patch->ndims > 3)
      problem << "patch->ndims is " << patch->ndims << "; 1 to 3 axes are supported";
    else if (options->array_order != SHARDTENSOR_ORDER_C &&
             options->array_order != SHARDTENSOR_ORDER_FORTRAN)
      problem << "options->array_order is " << options->array_order
              << "; use SHARDTENSOR_ORDER_C (0) or SHARDTENSOR_ORDER_FORTRAN (1)";
    else if (options->noverrides < 0 || (options->noverrides > 0 && options->overrides == nullptr))
      problem << "options->noverrides is " << options->noverrides << " with overrides "
              << (options->overrides == nullptr ? "NULL" : "given")
              << " (give a list of noverrides \"key=value\" strings, or 0 and NULL)";
    else
      problem << per_side_widths_problem(*options, patch->ndims);
    for (int i = 0; problem.tellp() == 0 && i < options->noverrides; ++i)
      if (options->overrides[i] == nullptr) problem << "options->overrides[" << i << "] is NULL";
    agree_on_arguments(own, problem.str());

    shardtensor::SolverPatch p;
    for (int d = 0; d < patch->ndims; ++d) {
      p.global_extent.push_back(patch->global_extent[d]);
      p.offset.push_back(patch->offset[d]);
      p.extent.push_back(patch->extent[d]);
      p.periodic.push_back(patch->periodic[d] != 0);
    }
    shardtensor::SessionOptions o;
    if (options->config != nullptr) o.config = options->config;
    if (options->config_text != nullptr) o.config_text = options->config_text;
    if (options->checkpoint != nullptr) o.checkpoint = options->checkpoint;
    o.input_channels = options->input_channels;
    o.output_channels = options->output_channels;
    o.arrays.order = options->array_order == SHARDTENSOR_ORDER_FORTRAN
                         ? shardtensor::ArrayOrder::fortran
                         : shardtensor::ArrayOrder::c;
    o.arrays.ghost_width = options->ghost_width;
    o.arrays.boundary_ghost_width = options->boundary_ghost_width;
    o.arrays.components = options->components;
    if (options->ghost_lower[0] != -1 || options->ghost_upper[0] != -1)
      for (int d = 0; d < patch->ndims; ++d) {
        o.arrays.ghost_lower.push_back(options->ghost_lower[d]);
        o.arrays.ghost_upper.push_back(options->ghost_upper[d]);
      }
    for (int i = 0; i < options->noverrides; ++i) o.overrides.emplace_back(options->overrides[i]);
    *session = new shardtensor_session_s{own, shardtensor::Session(comm, p, o),
                                         options->input_channels, options->output_channels};
    ++live_sessions;
  });
}

}  // namespace

extern "C" {

int shardtensor_initialize(void) {
  std::string mpi_state;
  if (!shardtensor::mpi_running(&mpi_state))
    return fail(SHARDTENSOR_ERROR_FAILED,
                std::string("shardtensor_initialize: MPI is ") + mpi_state +
                    ": call MPI_Init (or MPI_Init_thread) first and MPI_Finalize after "
                    "shardtensor_finalize");
  if (initialized) return SHARDTENSOR_OK;
  try {
    if (!Kokkos::is_initialized()) {
      if (kokkos_finalized_here)
        return fail(SHARDTENSOR_ERROR_FAILED,
                    "shardtensor_initialize: shardtensor_finalize already finalized Kokkos, "
                    "which cannot be initialized twice in one process");
      Kokkos::initialize();
      kokkos_initialized_here = true;
    }
  } catch (const std::exception& e) {
    return fail(SHARDTENSOR_ERROR_FAILED,
                std::string("shardtensor_initialize: Kokkos failed to start: ") + e.what());
  }
  initialized = true;
  return SHARDTENSOR_OK;
}

int shardtensor_finalize(void) {
  if (!initialized) return SHARDTENSOR_OK;
  if (live_sessions > 0)
    return fail(SHARDTENSOR_ERROR_INVALID_ARGUMENT,
                "shardtensor_finalize: " + std::to_string(live_sessions.load()) +
                    " session(s) still exist: shardtensor_destroy them first");
  initialized = false;
  if (kokkos_initialized_here) {
    try {
      Kokkos::finalize();
    } catch (const std::exception& e) {
      return fail(SHARDTENSOR_ERROR_FAILED,
                  std::string("shardtensor_finalize: Kokkos::finalize failed: ") + e.what());
    }
    kokkos_initialized_here = false;
    kokkos_finalized_here = true;
  }
  return SHARDTENSOR_OK;
}

const char* shardtensor_last_error(void) {
  return last_error.c_str();
}

void shardtensor_options_default(shardtensor_options* options) {
  if (options == nullptr) return;
  options->config = nullptr;
  options->config_text = nullptr;
  options->checkpoint = nullptr;
  options->input_channels = 1;
  options->output_channels = 1;
  options->array_order = SHARDTENSOR_ORDER_C;
  options->ghost_width = 0;
  options->boundary_ghost_width = -1;
  for (int d = 0; d < 3; ++d) options->ghost_lower[d] = options->ghost_upper[d] = -1;
  options->components = 1;
  options->overrides = nullptr;
  options->noverrides = 0;
}

int shardtensor_create(MPI_Comm comm, const shardtensor_patch* patch,
                       const shardtensor_options* options, shardtensor_session* session) {
  return create("shardtensor_create", comm, patch, options, session);
}

int shardtensor_create_f(MPI_Fint comm, const shardtensor_patch* patch,
                         const shardtensor_options* options, shardtensor_session* session) {
  return create("shardtensor_create_f", shardtensor::mpi_comm_from_fortran(comm), patch, options,
                session);
}

int shardtensor_destroy(shardtensor_session* session) {
  if (session == nullptr)
    return null_argument("shardtensor_destroy",
                         "session is NULL (expected the address of a shardtensor_session)");
  return guarded("shardtensor_destroy", SHARDTENSOR_ERROR_FAILED, [&] {
    if (*session == nullptr) return;  // like free(NULL)
    delete *session;
    *session = nullptr;
    --live_sessions;
  });
}

int shardtensor_infer_double(shardtensor_session session, const double* const* inputs, int ninputs,
                             double* const* outputs, int noutputs) {
  return infer("shardtensor_infer_double", session, inputs, ninputs, outputs, noutputs);
}

int shardtensor_infer_float(shardtensor_session session, const float* const* inputs, int ninputs,
                            float* const* outputs, int noutputs) {
  return infer("shardtensor_infer_float", session, inputs, ninputs, outputs, noutputs);
}

int shardtensor_train_step_double(shardtensor_session session, const double* const* inputs,
                                  int ninputs, const double* const* targets, int ntargets,
                                  double* loss) {
  return train_step("shardtensor_train_step_double", session, inputs, ninputs, targets, ntargets,
                    loss);
}

int shardtensor_train_step_float(shardtensor_session session, const float* const* inputs,
                                 int ninputs, const float* const* targets, int ntargets,
                                 double* loss) {
  return train_step("shardtensor_train_step_float", session, inputs, ninputs, targets, ntargets,
                    loss);
}

int shardtensor_save_checkpoint(shardtensor_session session, const char* path) {
  if (session == nullptr)
    return null_argument("shardtensor_save_checkpoint", "the session is NULL");
  return guarded("shardtensor_save_checkpoint", SHARDTENSOR_ERROR_FAILED, [&] {
    agree_on_arguments(session->comm, path == nullptr ? "path is NULL" : "");
    session->session.save_checkpoint(path);
  });
}

int shardtensor_load_checkpoint(shardtensor_session session, const char* path) {
  if (session == nullptr)
    return null_argument("shardtensor_load_checkpoint", "the session is NULL");
  return guarded("shardtensor_load_checkpoint", SHARDTENSOR_ERROR_FAILED, [&] {
    agree_on_arguments(session->comm, path == nullptr ? "path is NULL" : "");
    session->session.load_checkpoint(path);
  });
}

int shardtensor_last_call_copied(shardtensor_session session, int* copied) {
  if (session == nullptr)
    return null_argument("shardtensor_last_call_copied", "the session is NULL");
  if (copied == nullptr) return null_argument("shardtensor_last_call_copied", "copied is NULL");
  return guarded("shardtensor_last_call_copied", SHARDTENSOR_ERROR_FAILED,
                 [&] { *copied = session->session.last_call().input_copied ? 1 : 0; });
}

int shardtensor_last_call_copy_reason(shardtensor_session session, const char** reason) {
  if (session == nullptr)
    return null_argument("shardtensor_last_call_copy_reason", "the session is NULL");
  if (reason == nullptr)
    return null_argument("shardtensor_last_call_copy_reason", "reason is NULL");
  return guarded("shardtensor_last_call_copy_reason", SHARDTENSOR_ERROR_FAILED,
                 [&] { *reason = session->session.last_call().copy_reason.c_str(); });
}

int shardtensor_steps(shardtensor_session session, int64_t* steps) {
  if (session == nullptr) return null_argument("shardtensor_steps", "the session is NULL");
  if (steps == nullptr) return null_argument("shardtensor_steps", "steps is NULL");
  return guarded("shardtensor_steps", SHARDTENSOR_ERROR_FAILED,
                 [&] { *steps = session->session.steps(); });
}

}  // extern "C"
