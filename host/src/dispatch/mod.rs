//! Dispatcher: workers that claim tasks from the ready streams and send them.
