from espnet3.systems.f5tts.system import F5TTSSystem
from espnet3.systems.launch import launch

if __name__ == "__main__":
    launch(F5TTSSystem)
