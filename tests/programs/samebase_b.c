// shared: libsamebase_b.so
// link: cudart
#include "samebase.h"
