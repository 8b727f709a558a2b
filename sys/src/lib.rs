//! Kernel ABI for userdma. Structs, computed ioctl numbers and constants only; no logic.
