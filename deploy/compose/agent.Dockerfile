# An upstream A2A agent for deploy/compose.yaml: the official Python A2A SDK (a2a-sdk) serving
# the interop tests' reference echo agent. Build context: the repository root (..).
FROM python:3.11-slim
WORKDIR /agent
# The interop tests' pinned requirements: the same SDK version the test suite runs against.
COPY tests/interop/requirements.txt ./requirements.txt
RUN pip install --no-cache-dir --disable-pip-version-check -r requirements.txt
COPY tests/interop/echo_reference_agent.py ./echo_reference_agent.py
ENV PYTHONUNBUFFERED=1
USER 65534:65534
EXPOSE 9999
ENTRYPOINT ["python", "/agent/echo_reference_agent.py"]
CMD ["--host", "0.0.0.0", "--port", "9999"]
