#include "userdma.h"
#include "userdma.h"
int main(void) { return udma_version() == UDMA_VERSION ? 0 : 1; }
