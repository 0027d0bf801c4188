"""The discovery ISO pipeline: image service -> checked bytes -> file on a datastore."""
