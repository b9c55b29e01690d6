// kiln stand-in for <stddef.h>: size_t and ptrdiff_t are NVRTC built-ins; offsetof.
#pragma once
#ifndef offsetof
#define offsetof(type, member) ((size_t) & (((type*)0)->member))
#endif
#ifndef NULL
#define NULL 0
#endif
