#include "Interrupts.h"

namespace at::vnpu {
namespace {
InterruptTest g_test = nullptr;
}  // namespace

void set_interrupt_test(InterruptTest test) { g_test = test; }

bool is_interrupt(const std::exception& e) { return g_test != nullptr && g_test(e); }

}  // namespace at::vnpu
