//! libisolate.so
