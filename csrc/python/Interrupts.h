// Ctrl-C while a host thread waits for the device (see Interrupts.cpp).
#pragma once

namespace torch_vnpu {

// Installs the runtime's wait-interrupt hook and the PyTorch layer's interrupt
// raiser so that Python signals (SIGINT -> KeyboardInterrupt) end blocking
// waits promptly. Call once, with the GIL held, from the module's init.
void install_interrupt_handling();

}  // namespace torch_vnpu
