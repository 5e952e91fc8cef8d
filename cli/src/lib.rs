//! eve-cli: the `eve` command.
