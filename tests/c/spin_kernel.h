/* The test programs' kernel: it spins on the GPU's clock for its parameter's nanoseconds, so a
 * program runs on a real GPU as on the simulated one (which reads the same parameter). */
#ifndef VGPU_TEST_SPIN_KERNEL_H
#define VGPU_TEST_SPIN_KERNEL_H

static const char SPIN[] = ".version 7.0\n"
                           ".target sm_50\n"
                           ".address_size 64\n"
                           ".visible .entry spin(.param .u64 ns)\n"
                           "{\n"
                           "    .reg .u64 %start, %now, %spent, %ns;\n"
                           "    .reg .pred %more;\n"
                           "    ld.param.u64 %ns, [ns];\n"
                           "    mov.u64 %start, %globaltimer;\n"
                           "LOOP:\n"
                           "    mov.u64 %now, %globaltimer;\n"
                           "    sub.u64 %spent, %now, %start;\n"
                           "    setp.lt.u64 %more, %spent, %ns;\n"
                           "    @%more bra LOOP;\n"
                           "    ret;\n"
                           "}\n";

#endif
