# myprobe: see ARCHITECTURE.md (layout) and scripts/ (setup, throwaway MariaDB servers).
#   make setup   install the Debian packages the project needs, mount tracefs (root)
#   make build   cargo build --release
#   make test    setup + build + cargo test against a throwaway MariaDB (scripts/run-tests)
#   make demo    profile a throwaway MariaDB under sysbench load; writes demo-out/ (scripts/demo);
#                SERVER=mariadb-11.8 or SERVER=mysql-9.7 for another server (scripts/testdb)
#   make bench   overhead of the collectors on sysbench TPS (bench/overhead; COLLECTORS="cpu offcpu")
#   make kernels every command on Debian's kernels 5.10, 6.1, 6.12 and 7.2, each booted in qemu (scripts/kernels;
#                KERNELS="6.1 7.2" for some); one line per kernel, outputs in kernels-out/
#   make fuzz    the property tests of tests/fuzz.rs, long, with fresh seeds (scripts/fuzz; FUZZ_SECS=3600)
#   make clean   cargo clean, remove demo-out/ bench-out/, stop the demo and bench servers

SHELL := /bin/bash
CARGO ?= cargo
COLLECTORS ?=
SERVER ?= mariadb-10.11
KERNELS ?=

.PHONY: all build setup test demo bench kernels fuzz clean

all: build

build:
	$(CARGO) build --release

setup:
	scripts/setup

test:
	scripts/run-tests

demo:
	MYPROBE_TESTDB_SERVER=$(SERVER) scripts/demo

bench:
	bench/overhead $(COLLECTORS)

kernels: setup build
	scripts/kernels $(KERNELS)

fuzz:
	scripts/fuzz

clean:
	-scripts/testdb stop /tmp/myprobe-demo --clean
	-scripts/testdb stop /tmp/myprobe-bench --clean
	$(CARGO) clean
	rm -rf demo-out bench-out kernels-out
