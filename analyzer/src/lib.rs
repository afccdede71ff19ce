//! isolate analyzer
