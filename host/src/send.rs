//! TODO(role): filled by its issue.
