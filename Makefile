# Two entry points for a fresh Debian/Ubuntu machine: `make up` runs the appliance, `make test` the
# tests. Python packages go into a virtual environment (.venv): stock Debian 12 and Ubuntu 24.04
# refuse pip installs into the system interpreter (PEP 668).
PY ?= python3
VENV ?= .venv
APT_PACKAGES = mesa-vulkan-drivers libvulkan1 glslc glslang-tools vulkan-validationlayers \
               spirv-tools redis-server chromium chromium-driver docker-compose docker.io mmdebstrap
APT_PACKAGES += python3-venv

.PHONY: setup up test
setup: $(VENV)/.setup-stamp
$(VENV)/.setup-stamp: pyproject.toml Makefile
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi
	[ -x $(VENV)/bin/python ] || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	touch $@

up: setup
	$(VENV)/bin/vkllm up

test: setup
	$(VENV)/bin/python -m pytest -q
