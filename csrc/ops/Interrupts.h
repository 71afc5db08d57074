// Interrupts are not failures.
//
// Note [Interrupts are not failures]
// The executor tries things that may fail for ordinary reasons: a Meta kernel
// that cannot handle some input, a CPU kernel run on stand-ins. Such a failure
// is remembered (the op then runs synchronously, or the stand-in check is
// skipped). A KeyboardInterrupt (Ctrl-C, SIGINT) or another Python exception
// that derives from BaseException but not Exception (SystemExit, a test
// harness's timeout) can arrive while a Python Meta kernel runs; it must
// propagate at once and nothing may be cached from the interrupted attempt.
// This layer does not depend on Python, so the Python module registers the
// test (csrc/python/Module.cpp); without one, nothing is an interrupt.
#pragma once

#include <exception>

namespace at::vnpu {

using InterruptTest = bool (*)(const std::exception&);

// Installs the test. Not thread-safe against concurrent is_interrupt calls:
// call once at module initialisation.
void set_interrupt_test(InterruptTest test);

// True if `e` is an interrupt that must propagate (see the Note).
bool is_interrupt(const std::exception& e);

}  // namespace at::vnpu
