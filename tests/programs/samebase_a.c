// shared: libsamebase_a.so
// link: cudart
#include "samebase.h"
