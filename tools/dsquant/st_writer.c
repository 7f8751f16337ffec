#include "st_writer.h"
