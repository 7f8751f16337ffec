#include "awq_pack.h"
