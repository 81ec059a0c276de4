// The operator library's name, one per build: each ISA level's build registers its operators
// under its own namespace (`servelab_avx2::matvec`, ...), so that one process can load every
// build this CPU runs and the tests can run each kernel against each. The build passes
// -DSERVELAB_OPS=<namespace>; the macros below expand it before torch's registration macros
// paste it into their names.
#pragma once

#include <torch/library.h>

#ifndef SERVELAB_OPS
#error "build with -DSERVELAB_OPS=<operator namespace> (kernels/cpu_build.py does)"
#endif

#define SERVELAB_LIBRARY_IN(ns, m) TORCH_LIBRARY(ns, m)
#define SERVELAB_FRAGMENT_IN(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define SERVELAB_IMPL_IN(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

// TORCH_LIBRARY, TORCH_LIBRARY_FRAGMENT and TORCH_LIBRARY_IMPL for this build's namespace
#define SERVELAB_LIBRARY(m) SERVELAB_LIBRARY_IN(SERVELAB_OPS, m)
#define SERVELAB_FRAGMENT(m) SERVELAB_FRAGMENT_IN(SERVELAB_OPS, m)
#define SERVELAB_IMPL(key, m) SERVELAB_IMPL_IN(SERVELAB_OPS, key, m)
