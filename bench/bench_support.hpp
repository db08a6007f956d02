#pragma once
// What every benchmark measures with: command-line options, the slowest rank's time, CPU
// time (less inflated than wall time when other jobs share the cores) and peak memory.

#include <mpi.h>
#include <sys/resource.h>

#include <cstring>
#include <ctime>
#include <string>

namespace shardtensor::bench {

/// The value after `name` on the command line, or `fallback`.
inline std::string option(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

inline double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

/// CPU seconds this process has run.
inline double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/// The process's maximum resident set so far, MiB.
inline double peak_resident_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // Linux reports KiB
}

}  // namespace shardtensor::bench
