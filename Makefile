# Two entry points for a fresh Debian machine: `make up` runs the appliance, `make test` the tests.
PY ?= python3
APT_PACKAGES = mesa-vulkan-drivers libvulkan1 glslc glslang-tools vulkan-validationlayers \
               spirv-tools redis-server chromium chromium-driver docker-compose docker.io mmdebstrap

.PHONY: setup up test
setup: .setup-stamp
.setup-stamp: pyproject.toml Makefile
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi
	$(PY) -m pip install -q -e '.[test]'
	touch $@

up: setup
	vkllm up

test: setup
	$(PY) -m pytest -q
