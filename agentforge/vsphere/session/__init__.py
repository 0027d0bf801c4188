"""One logged-in vCenter session per whole credential, its logins and the registry of them."""
