//! Permits and tasks in Redis: every Lua script of pushonce lives here.
