"""The command line: `tfps run|local|chaos|bench|k8s`, the only place with flags."""
