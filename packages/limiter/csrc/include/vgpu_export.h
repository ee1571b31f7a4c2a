/* The one spelling of "this symbol is part of a library's interface": the libraries are built
 * with -fvisibility=hidden, so only what carries VGPU_EXPORT is visible to other objects. */
#ifndef VGPU_EXPORT_H
#define VGPU_EXPORT_H

#define VGPU_EXPORT __attribute__((visibility("default")))

#endif
