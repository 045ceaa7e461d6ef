"""The thin shell: backends apply operations to the kernel and read it back. No decisions."""
