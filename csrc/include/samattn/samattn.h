// Umbrella header of the samattn C++ API.
#pragma once

#include "samattn/attention.h"
#include "samattn/error.h"
#include "samattn/gemm.h"
#include "samattn/types.h"
#include "samattn/version.h"
