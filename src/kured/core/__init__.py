"""Pure rules: the reboot window, the decision policy, the lock record format. No IO."""
