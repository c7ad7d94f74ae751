//! Reference interpreter (in progress).
