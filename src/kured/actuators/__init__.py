"""Actuators change the world: trigger the reboot (command or signal)."""
