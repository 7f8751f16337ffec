#include "safetensors.h"
