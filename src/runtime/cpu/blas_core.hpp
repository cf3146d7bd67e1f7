// Which of OpenBLAS's kernel families runs Alloy's GEMMs. OpenBLAS built with DYNAMIC_ARCH (as
// Debian ships it) picks the family from the CPU's model number at load time; version 0.3.21
// (Debian 12) does not know newer Intel models such as Emerald Rapids and falls back to its
// Prescott (SSE3) kernels, which run sgemm at a tenth of the AVX-512 kernels' rate. Alloy then
// picks the family from the instruction sets the CPU reports, the rule later OpenBLAS releases
// apply themselves. OPENBLAS_CORETYPE, when set, is the user's choice and is kept.
#pragma once

#include <string>

namespace alloy {

// Instruction sets that decide the kernel family.
struct CpuVectorFeatures {
  bool avx = false;
  bool avx2_fma = false;        // AVX2 and FMA3
  bool avx512 = false;          // AVX-512 F, BW, DQ and VL
  bool avx512_bf16 = false;
};

CpuVectorFeatures cpu_vector_features();

// The kernel family to switch to, or "" to keep `detected`: a switch happens only when the
// detected family uses an older instruction set than `features` allow, and never for a family
// this table does not know (another architecture, a newer OpenBLAS).
std::string blas_core_upgrade(const std::string& detected, const CpuVectorFeatures& features);

struct BlasCore {
  std::string name;      // the family GEMMs run on now, as OpenBLAS names it
  std::string detected;  // what OpenBLAS chose at load time
  std::string note;      // one line for people: why this family
};

// Selects the family once (thread-safe; call before BLAS runs on several threads, as
// runtime_set_threads does) and reports it.
const BlasCore& blas_core();

}  // namespace alloy
