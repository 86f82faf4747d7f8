"""The job types, one folder per domain; `catalog.REGISTRY` lists every one. Importing this
package imports no handler: the statistics child process loads only what it parses with."""
