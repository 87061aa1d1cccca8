"""What several test modules share: switch processes beyond softswitch and the controller's helpers."""
