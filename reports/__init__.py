"""HTML reports built from run and sweep directories."""
