// kiln stand-in for <stdio.h>: device printf is an NVRTC built-in.
#pragma once
